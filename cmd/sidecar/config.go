package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/node"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
	"github.com/conductor-sidecar/sidecar/tracing"
)

// envOr returns the environment variable name, or def when it is unset.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// Config is the configuration of "sidecar serve". Every field has a flag
// and an environment variable SIDECAR_<FLAG NAME IN UPPER SNAKE CASE>.
type Config struct {
	ConductorURL string
	// ConductorMaxCalls bounds serve's calls at Conductor at once, batch
	// polls aside (0 after a bad environment value).
	ConductorMaxCalls int
	// Store is where the run event log, the EventIdRegistry and the
	// control API's replies live: "nats" (JetStream, the default) or a
	// PostgreSQL URL (postgres://user@host:port/database).
	Store string
	// AcceptNewNATSState pairs the PostgreSQL store with this NATS state
	// even though it was used with another (pairNATS).
	AcceptNewNATSState bool
	NATSURL            string
	DataDir            string
	Listen             string
	DrainTimeout       time.Duration
	SyncInterval       time.Duration
	WorkerID           string
	TaskDomain         string
	Concurrency        map[string]int
	// NATSReplicas is the replica count of the stream, the KV buckets and
	// the object store serve creates (1 to 5; more than 1 on a cluster).
	NATSReplicas int
	// NATSStartTimeout bounds how long serve, with --nats-url, starts
	// again while the NATS cluster is not ready (startWithRetry); 0 fails
	// at the first error.
	NATSStartTimeout time.Duration
	// PollersPerType is the number of poll loops per task type, which
	// share its concurrency (taskworkers.Options.PollersPerType).
	PollersPerType int
	// ListFinishedInMemory is how many finished runs' rows of the run list
	// each replica keeps in memory (runlist.Options.MaxFinished).
	ListFinishedInMemory int
	// ControlRepliesMaxMiB bounds the kept answers of Idempotency-Key
	// requests (JetStream's bucket or PostgreSQL's table), in MiB.
	ControlRepliesMaxMiB int
	ShutdownGrace        time.Duration
	LogFormat            string
	LogLevel             string
	ValidateWrites       bool
	// PprofListen, when set, serves net/http/pprof on this loopback
	// address (profiling; empty: off).
	PprofListen string
	// NATS is how serve reaches NATS securely.
	NATS natsConfig
	// API is the control API's authentication, authorization and TLS.
	API apiConfig
	// Proxy is the task proxy for outside workers.
	Proxy proxyConfig
	// Adopt is the adoption of existing workflow definitions.
	Adopt adoptConfig
	// Exec bounds what plans may reach (environment, files, addresses).
	Exec execConfig
	// Bus is the event bus's sinks.
	Bus busConfig
	// Admission is admission control (limits on active runs).
	Admission admissionConfig
	// Retention moves finished runs to an archive.
	Retention retentionConfig

	// env keeps the SIDECAR_* values the flags refused (Validate).
	env envSettings
}

// DefaultConfig returns the defaults docs/operations.md lists.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ConductorURL:         "http://localhost:8080/api",
		ConductorMaxCalls:    adapter.DefaultMaxConcurrentCalls,
		API:                  apiConfig{MaxRequestsPerPrincipal: httpapi.DefaultMaxRequestsPerPrincipal},
		Store:                "nats",
		DataDir:              "./data",
		Listen:               "127.0.0.1:8787",
		DrainTimeout:         5 * time.Minute,
		WorkerID:             "sidecar-" + host,
		Concurrency:          map[string]int{plan.ExecutorCommand: 4, plan.ExecutorHTTP: 16, plan.ExecutorNoop: 16, plan.ExecutorSleep: 16},
		ShutdownGrace:        30 * time.Second,
		PollersPerType:       1,
		ListFinishedInMemory: runlist.DefaultMaxFinished,
		ControlRepliesMaxMiB: httpapi.DefaultRepliesMaxBytes >> 20,
		NATSReplicas:         1,
		Proxy:                proxyConfig{MaxUpstream: proxy.DefaultMaxUpstreamConnections, MaxTaskOutputKiB: proxy.DefaultMaxTaskOutputBytes >> 10},
		NATSStartTimeout:     2 * time.Minute,
		LogFormat:            "json",
		LogLevel:             "info",
		Bus:                  busConfig{MaxAttempts: 8},
		Admission:            admissionConfig{Policy: "queue", Delay: 30 * time.Second, MaxQueued: 10000},
	}
}

// minRepliesMiB and maxRepliesMiB bound --control-replies-max-mib: the
// bucket holds at least a few bulk answers (about 1 MiB each, in parts),
// and at most 1 TiB.
const (
	minRepliesMiB = 16
	maxRepliesMiB = 1 << 20
)

// appendURLProblem is p with, when url (a PostgreSQL URL given by flag)
// cannot be parsed, the problem saying why (the password masked).
func appendURLProblem(p []string, url, flag string) []string {
	var se *statestore.Error
	if err := pgstore.CheckURL(url, flag); errors.As(err, &se) {
		return append(p, se.Message)
	}
	return p
}

// postgresStore reports whether --store names a PostgreSQL database.
func (c *Config) postgresStore() bool {
	return strings.HasPrefix(c.Store, "postgres://") || strings.HasPrefix(c.Store, "postgresql://")
}

// node is the configuration of the node serve opens. It binds the API's
// listeners (own are the process's other listeners, which no step and no
// webhook may reach) and reads the credential files; the listeners are
// closed again when it fails.
func (c *Config) node(log *zap.Logger, own []string) (nc node.Config, err error) {
	nc = node.Config{ConductorURL: c.ConductorURL, ConductorMaxCalls: c.ConductorMaxCalls, AcceptNewNATSState: c.AcceptNewNATSState,
		NATSURL: c.NATSURL, NATSURLShown: redactURL(c.NATSURL), Replicas: c.NATSReplicas,
		Embedded:     natsstore.EmbeddedConfig{DataDir: c.DataDir, Listen: c.NATS.Listen, SyncInterval: c.SyncInterval},
		DrainTimeout: c.DrainTimeout, WorkerID: c.WorkerID, TaskDomain: c.TaskDomain, Concurrency: c.Concurrency,
		PollersPerType: c.PollersPerType, ValidateWrites: c.ValidateWrites, ListFinishedInMemory: c.ListFinishedInMemory,
		RepliesMaxBytes: int64(c.ControlRepliesMaxMiB) << 20,
		Admission: node.Admission{Limits: c.Admission.Limits, Policy: c.Admission.Policy, Delay: c.Admission.Delay, MaxQueued: c.Admission.MaxQueued,
			MaxQueuedPerTenant: c.Admission.MaxQueuedPerTenant},
		Secrets: &secrets.Resolver{Logger: log}}
	if c.postgresStore() {
		nc.Postgres = c.Store
	}
	// Traces: the standard OTEL_* environment (docs/tracing.md).
	if nc.Tracing, err = tracing.ConfigFromEnv(os.Getenv); err != nil {
		return nc, err
	}
	// The API's address is bound now so that neither the http executor
	// nor a webhook sink can be pointed at it; the node serves it once
	// every component is open.
	if nc.API, err = listenHeld(c.Listen); err != nil {
		return nc, listenFailed("--listen", c.Listen, err)
	}
	defer func() {
		if err != nil {
			closeListeners(nc)
		}
	}()
	if c.API.MetricsListen != "" {
		if nc.Metrics, err = listenHeld(c.API.MetricsListen); err != nil {
			return nc, listenFailed("--metrics-listen", c.API.MetricsListen, err)
		}
		own = append(slices.Clone(own), nc.Metrics.Addr().String())
	}
	c.Adopt.apply(&nc)
	if err = c.Proxy.apply(&nc); err != nil {
		return nc, err
	}
	if nc.ConductorProxy != nil {
		own = append(slices.Clone(own), nc.ConductorProxy.Addr().String())
	}
	// Never reachable by an http step or a webhook: the API, the metrics
	// listener, pprof and NATS (the servers of --nats-url; the node adds
	// the embedded server's listener).
	nc.Own = append(append([]string{nc.API.Addr().String()}, own...), natsHostPorts(c.NATSURL)...)
	if c.NATSURL != "" {
		if nc.NATSOptions, err = c.NATS.connectOptions(); err != nil {
			return nc, err
		}
	} else if c.NATS.Listen != "" {
		if nc.Embedded.Password, err = c.NATS.password(); err != nil {
			return nc, err
		}
		// Replicas sharing this server run retention as its retention
		// user, with the same --retention-nats-password-file.
		if c.Retention.Finished > 0 && c.Retention.PasswordFile != "" {
			if nc.Embedded.RetentionPassword, err = (&natsConfig{PasswordFile: c.Retention.PasswordFile}).password(); err != nil {
				return nc, fmt.Errorf("--retention-nats-password-file: %w", err)
			}
		}
	}
	if nc.Retention, err = c.Retention.node(c.NATSURL, nc.NATSOptions); err != nil {
		return nc, err
	}
	if nc.Bus, err = c.Bus.node(); err != nil {
		return nc, err
	}
	if err := c.Exec.apply(&nc.Exec, nc.Secrets, nc.Own[0], c.ConductorURL, nc.Own[1:]...); err != nil {
		return nc, err
	}
	return nc, c.API.apply(&nc.APIOptions, log)
}

// closeListeners closes the listeners of nc (their sockets: a
// heldListener's Close would only end a server's session).
// listenFailed is the error of a listener flag whose address could not be
// bound: ADDRESS_IN_USE with the fix when another process holds it.
func listenFailed(flag, addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("ADDRESS_IN_USE: %s %s: another process listens there (ss -ltnp shows which): stop it, or give %s another address", flag, addr, flag)
	}
	return fmt.Errorf("%s %s: %w", flag, addr, err)
}

func closeListeners(nc node.Config) {
	for _, ln := range []net.Listener{nc.API, nc.Metrics, nc.ConductorProxy} {
		switch ln := ln.(type) {
		case nil:
		case *heldListener:
			_ = ln.release()
		default:
			_ = ln.Close()
		}
	}
}

// ConfigValidationError lists every invalid setting.
type ConfigValidationError struct{ Problems []string }

func (e *ConfigValidationError) Error() string {
	return "CONFIG_INVALID: invalid configuration:\n  " + strings.Join(e.Problems, "\n  ")
}

// Validate checks c and returns a *ConfigValidationError naming every problem.
func (c *Config) Validate() error {
	p := append([]string(nil), c.env.problems...)
	if u, err := url.Parse(c.ConductorURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p = append(p, fmt.Sprintf("--conductor-url %q: want an http(s) URL like http://localhost:8080/api", redactURL(c.ConductorURL)))
	}
	if c.ConductorMaxCalls < 1 {
		p = append(p, fmt.Sprintf("--conductor-max-concurrent-calls %d: want a whole number of at least 1 (default %d)", c.ConductorMaxCalls, adapter.DefaultMaxConcurrentCalls))
	}
	if c.Store != "nats" && !c.postgresStore() {
		p = append(p, "--store "+redactURL(c.Store)+": want nats or a PostgreSQL URL like postgres://sidecar@db:5432/sidecar (password from PGPASSFILE or PGPASSWORD)")
	} else if c.postgresStore() {
		p = appendURLProblem(p, c.Store, "--store")
	}
	if c.NATSURL == "" && c.DataDir == "" {
		p = append(p, "--data-dir is required with the embedded NATS server (no --nats-url)")
	}
	if c.Listen == "" {
		p = append(p, "--listen is required")
	}
	if c.DrainTimeout <= 0 {
		p = append(p, "--drain-timeout must be > 0")
	}
	if c.SyncInterval < 0 {
		p = append(p, "--sync-interval must be >= 0 (0: fsync every write)")
	}
	if c.NATSStartTimeout < 0 {
		p = append(p, "--nats-start-timeout must be >= 0 (0: no retry)")
	}
	if c.ShutdownGrace < 0 {
		p = append(p, "--shutdown-grace must be >= 0")
	}
	if c.WorkerID == "" {
		p = append(p, "--worker-id is required")
	}
	switch {
	case c.NATSReplicas < 1 || c.NATSReplicas > 5:
		p = append(p, fmt.Sprintf("--nats-replicas %d: want 1 to 5 (JetStream's limit)", c.NATSReplicas))
	case c.NATSReplicas > 1 && c.NATSURL == "":
		p = append(p, fmt.Sprintf("--nats-replicas %d needs --nats-url of a NATS cluster: the embedded server is one node", c.NATSReplicas))
	}
	if c.PollersPerType < 1 || c.PollersPerType > 64 {
		p = append(p, fmt.Sprintf("--pollers-per-type %d: want 1 to 64 (more than 1 only on a Conductor whose queue takes concurrent polls, such as its PostgreSQL store)", c.PollersPerType))
	}
	if c.ControlRepliesMaxMiB < minRepliesMiB || c.ControlRepliesMaxMiB > maxRepliesMiB {
		p = append(p, fmt.Sprintf("--control-replies-max-mib %d: want %d to %d (a bulk answer is kept in parts of up to 1 MiB)", c.ControlRepliesMaxMiB, minRepliesMiB, maxRepliesMiB))
	}
	if c.ListFinishedInMemory < 1 {
		p = append(p, fmt.Sprintf("--list-finished-in-memory %d: want at least 1", c.ListFinishedInMemory))
	}
	if strings.ContainsAny(c.TaskDomain, " ,:*/") {
		p = append(p, "--task-domain must not contain spaces, ',', ':', '*' or '/'")
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		p = append(p, "--log-format must be json or console")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		p = append(p, "--log-level must be debug, info, warn or error")
	}
	if c.PprofListen != "" {
		if !loopbackListen(c.PprofListen) {
			p = append(p, "--pprof-listen must be a loopback address such as 127.0.0.1:6060: profiles expose the process's memory")
		}
	}
	p = append(p, c.NATS.validate(c.NATSURL)...)
	p = append(p, c.API.validate(c.Listen)...)
	p = append(p, c.Proxy.validate(c.Listen, c.API.MetricsListen)...)
	p = append(p, c.Adopt.validate()...)
	p = append(p, c.Exec.validate()...)
	p = append(p, c.Bus.validate()...)
	p = append(p, c.Admission.validate()...)
	p = append(p, c.Retention.validate(c.postgresStore(), c.NATSURL, c.NATS.Listen)...)
	p = append(p, c.secretFileProblems()...)
	if len(p) > 0 {
		return &ConfigValidationError{Problems: p}
	}
	return nil
}

// registerFlags binds c's fields to fs, with environment fallbacks read now.
func (c *Config) registerFlags(fs *flag.FlagSet) {
	str := func(p *string, name, usage string) { stringFlag(fs, p, name, usage) }
	env := &c.env
	dur := func(p *time.Duration, name, usage string) {
		fs.Var(&durationValue{p}, name, usage+" (env "+envName(name)+")")
		env.set(fs, name)
	}
	str(&c.ConductorURL, "conductor-url", "Conductor API base URL")
	fs.Var(&intValue{&c.ConductorMaxCalls}, "conductor-max-concurrent-calls", "calls serve has at Conductor at once, its task workers' batch polls and the health check aside (each takes one of Conductor's request threads; control calls take at most three quarters); more wait for a place (sidecar_conductor_calls_waiting) (env "+envName("conductor-max-concurrent-calls")+")")
	if v, ok := os.LookupEnv(envName("conductor-max-concurrent-calls")); ok {
		if fs.Set("conductor-max-concurrent-calls", v) != nil {
			c.ConductorMaxCalls = 0 // Validate names it
		}
	}
	str(&c.Store, "store", "where the run event log, the event ids and the control replies live: nats, or postgres://user@host:port/database (keep the password out of the URL: PGPASSFILE or PGPASSWORD)")
	str(&c.NATSURL, "nats-url", "external NATS URL; empty runs an embedded server")
	str(&c.DataDir, "data-dir", "embedded NATS store directory")
	str(&c.Listen, "listen", "control API and /metrics address")
	dur(&c.DrainTimeout, "drain-timeout", "default drain timeout of a pause")
	dur(&c.SyncInterval, "sync-interval", "embedded NATS fsync interval; 0 fsyncs every write before acknowledging")
	dur(&c.NATSStartTimeout, "nats-start-timeout", "with --nats-url: how long serve keeps starting again while the NATS cluster is not ready (no JetStream leader yet, streams still being created); other errors fail at once; 0: no retry")
	dur(&c.ShutdownGrace, "shutdown-grace", "how long running steps may finish after SIGTERM")
	str(&c.WorkerID, "worker-id", "worker id reported to Conductor (unique and stable per replica: a restart recovers the tasks left under it)")
	str(&c.TaskDomain, "task-domain", "Conductor task domain of this deployment's runs; sidecars sharing a Conductor but not NATS need distinct domains (empty: none)")
	str(&c.LogFormat, "log-format", "json or console")
	str(&c.LogLevel, "log-level", "debug, info, warn or error")
	str(&c.PprofListen, "pprof-listen", "serve net/http/pprof on this loopback address, for profiling (empty: off)")
	fs.Var(&concurrencyValue{c.Concurrency}, "concurrency", "steps run at once per executor, e.g. command=4,http=16 (env "+envName("concurrency")+")")
	env.set(fs, "concurrency")
	fs.Var(&intValue{&c.NATSReplicas}, "nats-replicas", "replicas of the event stream, the KV buckets and the object store when serve creates them (1 to 5; more than 1 needs a NATS cluster at --nats-url) (env "+envName("nats-replicas")+")")
	if v, ok := os.LookupEnv(envName("nats-replicas")); ok {
		if fs.Set("nats-replicas", v) != nil {
			c.NATSReplicas = 0 // Validate names it
		}
	}
	fs.Var(&intValue{&c.ControlRepliesMaxMiB}, "control-replies-max-mib", "MiB the kept answers of control requests with an Idempotency-Key may hold (JetStream bucket "+httpapi.KVRepliesBucket+", or PostgreSQL table control_replies, pruned once a minute); at the bound the oldest are evicted before their 24 h, and a retry of an evicted key runs its action again (docs/drain.md) (env "+envName("control-replies-max-mib")+")")
	if v, ok := os.LookupEnv(envName("control-replies-max-mib")); ok {
		if fs.Set("control-replies-max-mib", v) != nil {
			c.ControlRepliesMaxMiB = 0 // Validate names it
		}
	}
	fs.Var(&intValue{&c.ListFinishedInMemory}, "list-finished-in-memory", "finished runs of the run list each replica keeps in memory, the newest (about 1 KB each); older ones are read from NATS when a listing reaches them (env "+envName("list-finished-in-memory")+")")
	if v, ok := os.LookupEnv(envName("list-finished-in-memory")); ok {
		if fs.Set("list-finished-in-memory", v) != nil {
			c.ListFinishedInMemory = 0 // Validate names it
		}
	}
	fs.Var(&intValue{&c.PollersPerType}, "pollers-per-type", "poll loops per task type, sharing its concurrency; more than 1 only on a Conductor whose queue takes concurrent polls (PostgreSQL: yes; the memory store: no) (env "+envName("pollers-per-type")+")")
	if v, ok := os.LookupEnv(envName("pollers-per-type")); ok {
		if fs.Set("pollers-per-type", v) != nil {
			c.PollersPerType = 0 // Validate names it
		}
	}
	boolFlag(fs, env, &c.AcceptNewNATSState, "accept-new-nats-state", "with --store postgres://: start although the database was used with other NATS state (a lost data dir); with the JetStream log: start although the run index is missing beside a log of records; its runs in flight are not resumed")
	boolFlag(fs, env, &c.ValidateWrites, "validate-transitions", "reject invalid transitions at append time (Layer 2)")
	c.NATS.registerFlags(fs, env)
	c.API.registerFlags(fs, env)
	c.Exec.registerFlags(fs, env)
	c.Bus.registerFlags(fs, env)
	c.Admission.registerFlags(fs, env)
	c.Proxy.registerFlags(fs, env)
	c.Adopt.registerFlags(fs, env)
	c.Retention.registerFlags(fs, env)
}

// stringFlag binds p to the flag name of fs, with SIDECAR_<NAME> as its
// default when set.
func stringFlag(fs *flag.FlagSet, p *string, name, usage string) {
	fs.StringVar(p, name, envOr(envName(name), *p), usage+" (env "+envName(name)+")")
}

// boolFlag binds p to the flag name of fs; SIDECAR_<NAME> sets it, in any
// form the command line takes (true, 1, TRUE, false, ...).
func boolFlag(fs *flag.FlagSet, env *envSettings, p *bool, name, usage string) {
	fs.BoolVar(p, name, *p, usage+" (env "+envName(name)+")")
	env.set(fs, name)
}

// envSettings applies SIDECAR_* variables to the flags they stand for and
// keeps every value a flag refused: Validate reports them, so a bad value
// in the environment stops the start as it would on the command line,
// instead of leaving the default in place.
type envSettings struct{ problems []string }

// set applies the variable of flag name, when it is set, and tells whether
// it was.
// An empty boolean is unset (false, unless the default says otherwise).
func (e *envSettings) set(fs *flag.FlagSet, name string) bool {
	v, ok := os.LookupEnv(envName(name))
	if b, isBool := fs.Lookup(name).Value.(interface{ IsBoolFlag() bool }); ok && v == "" && isBool && b.IsBoolFlag() {
		return false
	}
	if ok {
		err := fs.Set(name, v)
		if b, isBool := fs.Lookup(name).Value.(interface{ IsBoolFlag() bool }); err != nil && isBool && b.IsBoolFlag() {
			err = errors.New("want true or false (also 1, 0, TRUE, FALSE)")
		}
		e.check(name, v, err)
	}
	return ok
}

// check keeps err, the refusal of value for flag name, as a problem.
func (e *envSettings) check(name, value string, err error) {
	if err != nil {
		e.problems = append(e.problems, fmt.Sprintf("%s=%q: %v", envName(name), value, err))
	}
}

func envName(flagName string) string {
	return "SIDECAR_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

type durationValue struct{ p *time.Duration }

func (d *durationValue) String() string {
	if d.p == nil {
		return ""
	}
	return d.p.String()
}

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration like 30s or 5m")
	}
	*d.p = v
	return nil
}

type intValue struct{ p *int }

func (v *intValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want a whole number")
	}
	*v.p = n
	return nil
}

type concurrencyValue struct{ m map[string]int }

func (c *concurrencyValue) String() string {
	if c.m == nil {
		return ""
	}
	var parts []string
	for _, k := range []string{plan.ExecutorCommand, plan.ExecutorHTTP, plan.ExecutorNoop, plan.ExecutorSleep} {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c.m[k]))
	}
	return strings.Join(parts, ",")
}

func (c *concurrencyValue) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			return fmt.Errorf("want executor=count pairs, got %q", part)
		}
		switch k {
		case plan.ExecutorCommand, plan.ExecutorHTTP, plan.ExecutorNoop, plan.ExecutorSleep:
			c.m[k] = n
		default:
			return fmt.Errorf("unknown executor %q", k)
		}
	}
	return nil
}
