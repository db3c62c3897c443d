// Package soak runs the sidecar's compressed-time retention soak: a serve
// with --retain-finished and a file archive next to a real Conductor,
// short runs submitted at a steady rate, and what hot state holds sampled
// at a fixed interval. After the first retention window every series is
// expected to stay flat; at the end every run is archived, the archive
// verifies and Conductor holds none of the runs' workflows.
//
// The program bench/soak/cmd/soak runs it from the command line
// (docs/retention.md, "The soak"); e2e's bounded soak runs it in a test.
package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/archive"
)

// Config is one soak.
type Config struct {
	// Sidecar is the sidecar binary.
	Sidecar string
	// Root is the repository's root (for deploy/local/*.sh and
	// deploy/postgres/roles.sql).
	Root string
	// Dir holds the data dir, the archive, the logs (created; it should be
	// empty).
	Dir string
	// Window is serve's --retain-finished; Rate the runs submitted a
	// second for Duration; Sample how often hot state is sampled.
	Window, Duration, Sample time.Duration
	Rate                     float64
	// Steps is how many noop steps a run has (in series; default 1).
	Steps int
	// ConductorURL is a running Conductor's API (…/api) to use; empty:
	// the soak starts its own with deploy/local/conductor.sh on
	// ConductorPort, state in Dir/conductor, and stops it at the end.
	ConductorURL  string
	ConductorPort int
	// Postgres: the log is in PostgreSQL (--store postgres://); the soak
	// starts its own cluster with deploy/local/postgres.sh on PostgresPort
	// (state in Dir/pg) unless PostgresAdminURL names a superuser's URL of
	// a running one; it creates a database and its roles with
	// deploy/postgres/roles.sql and `sidecar migrate`.
	Postgres         bool
	PostgresPort     int
	PostgresAdminURL string
	// Settle is how long, after the last submission, the soak waits for
	// every run to be removed (default Window + 3 min).
	Settle time.Duration
	// HeapProfile, when positive, is how often the soak saves serve's heap
	// profile (a collection first: /debug/pprof/heap?gc=1) as
	// Dir/heap-<seconds into the soak>.pb.gz; serve then listens for
	// pprof on a loopback port of its own (--pprof-listen). One more is
	// saved at the end of the settle.
	HeapProfile time.Duration
	// Log gets progress lines; CSV the samples (both may be nil).
	Log, CSV io.Writer
}

// Sample is hot state at one moment.
type Sample struct {
	Elapsed time.Duration
	// Submitted and SubmitErrors count POST /v1/runs by the soak; the rest
	// are serve's metrics: runs started, ended (the watcher's terminal
	// runs), archived and removed by retention.
	Submitted, SubmitErrors              int64
	Started, Finished, Archived, Removed int64
	// Active is sidecar_runs_active summed over statuses.
	Active int64
	// LogRecords and LogBytes are sidecar_log_records and sidecar_log_bytes
	// (on PostgreSQL LogRecords is run_events counted, exactly).
	LogRecords, LogBytes int64
	// DiskBytes is the data dir's files (and, on PostgreSQL, the sidecar
	// database's size).
	DiskBytes int64
	// RSS is serve's resident set (/proc/PID/status VmRSS); HeapInuse the
	// Go heap's spans in use (go_memstats_heap_inuse_bytes), a part of it.
	RSS, HeapInuse int64
	// Runtime are serve's Go runtime metrics by column (runtimeColumns):
	// shown beside RSS to tell the live heap from the allocator's
	// headroom; a column the scrape lacked is Missing.
	Runtime map[string]int64
	// LiveBytes is what the JetStream streams' messages hold (the sum of
	// their State.Bytes): DiskBytes without the space of removed messages
	// that a stream's blocks keep until compacted, and without indexes.
	// Shown next to DiskBytes, not judged: the target is bytes on disk.
	LiveBytes int64
	// StreamDisk is each JetStream stream's directory in the data dir
	// (embedded server): which stream the bytes on disk are in.
	StreamDisk map[string]int64
	// Missing are the columns whose metric serve's /metrics did not have
	// at this sample (a collector that timed out leaves its metric out):
	// unknown, not 0, and left out of the steady series.
	Missing []string
	// Messages per JetStream stream (a bucket is KV_<name>), and rows per
	// PostgreSQL table of the log.
	Messages map[string]int64
	// Conductor is how many of the submitted runs' workflows Conductor
	// still holds: submitted minus the oldest ones found gone (a run is
	// removed about in submission order).
	Conductor int64
}

// Series is one sampled quantity over the steady part of the soak.
type Series struct {
	Name           string
	Min, Max, Mean float64
	// Flat: every sample within ±15 % of the mean (or within FlatSlack).
	Flat bool
	// Judged: the verdict is over this series (judged); the others are
	// shown.
	Judged bool
}

// Ratio is Max/Min (1 when both are 0).
func (s Series) Ratio() float64 {
	if s.Min == 0 {
		if s.Max == 0 {
			return 1
		}
		return math.Inf(1)
	}
	return s.Max / s.Min
}

// Result is what a soak saw.
type Result struct {
	Samples []Sample
	// Steady are the series over the samples from the end of the first
	// retention window (Window plus two retention passes) to the last
	// submission.
	Steady []Series
	// Runs is every run submitted (runId and workflowId).
	Runs []Run
	// Final is hot state once every run was removed (or Settle passed).
	Final Sample
	// NotArchived are runs the archive does not hold at the end;
	// ConductorLeft the runs whose workflow Conductor still holds.
	NotArchived, ConductorLeft []string
	// VerifyOutput is `sidecar archive verify`'s output; VerifyErr its
	// failure (nil: clean).
	VerifyOutput string
	VerifyErr    error
}

// Flat reports whether every steady series is flat.
func (r *Result) Flat() bool {
	for _, s := range r.Steady {
		if s.Judged && !s.Flat {
			return false
		}
	}
	return len(r.Steady) > 0
}

// Run is one submitted run.
type Run struct{ RunID, WorkflowID string }

// FlatTolerance is how far from the mean a steady sample may be; a
// series that moves by FlatSlack or less is flat too (a count of a few
// runs in flight cannot stay within 15 %).
const (
	FlatTolerance = 0.15
	FlatSlack     = 10
)

// runListBucket is the run list's bucket (runlist.DefaultBucket).
const runListBucket = "SIDECAR_RUNLIST"

// judged are the series the verdict is over: what hot state holds on
// disk and in memory (and Conductor's workflows); the run list's bucket
// by its keys, its messages include 15 minutes of removed runs' markers.
// The parts that explain a judged series (each stream's directory, the
// streams' live bytes, the Go heap) are shown, not judged.
func judged(name string) bool {
	switch {
	case name == "msgs_KV_"+runListBucket:
		return false
	case strings.HasPrefix(name, "msgs_"), strings.HasPrefix(name, "keys_"):
		return true
	}
	switch name {
	case "log_records", "log_bytes", "disk_bytes", "rss_bytes", "conductor_workflows":
		return true
	}
	return false
}

// retentionPass is how often serve's retention looks for due runs
// (retention.DefaultInterval).
const retentionPass = 10 * time.Second

type soak struct {
	cfg       Config
	conductor string
	apiURL    string
	pprofURL  string
	serve     *exec.Cmd
	pgAdmin   string
	pgDB      string
	pgOwner   string
	nc        *nats.Conn
	js        jetstream.JetStream
	http      *http.Client
	stops     []func()

	mu       sync.Mutex
	runs     []Run
	goneUpTo int // runs[:goneUpTo] are known gone from Conductor
	sub, err atomic.Int64
}

// Do runs the soak and returns what it saw. An error means the soak could
// not run (a component did not start); what the soak found is in Result.
func Do(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Steps <= 0 {
		cfg.Steps = 1
	}
	if cfg.Settle <= 0 {
		cfg.Settle = cfg.Window + 3*time.Minute
	}
	if cfg.Sample <= 0 {
		cfg.Sample = 10 * time.Second
	}
	if cfg.Rate <= 0 || cfg.Window <= 0 || cfg.Duration <= 0 {
		return nil, errors.New("soak: rate, window and duration must be positive")
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	s := &soak{cfg: cfg, http: &http.Client{Timeout: time.Minute}}
	defer s.stop()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := s.startConductor(ctx); err != nil {
		return nil, err
	}
	if err := s.startServe(ctx); err != nil {
		return nil, err
	}
	return s.run(ctx)
}

func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.cfg.Log, "%s soak: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (s *soak) stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

func (s *soak) script(name string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(s.cfg.Root, "deploy", "local", name), args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd.CombinedOutput()
}

func (s *soak) startConductor(ctx context.Context) error {
	if s.cfg.ConductorURL != "" {
		s.conductor = strings.TrimSuffix(s.cfg.ConductorURL, "/")
		return nil
	}
	env := []string{"CONDUCTOR_STATE_DIR=" + filepath.Join(s.cfg.Dir, "conductor"), fmt.Sprintf("CONDUCTOR_PORT=%d", s.cfg.ConductorPort)}
	s.logf("starting Conductor on :%d", s.cfg.ConductorPort)
	if out, err := s.script("conductor.sh", env, "start"); err != nil {
		return fmt.Errorf("deploy/local/conductor.sh start: %v\n%s", err, out)
	}
	s.stops = append(s.stops, func() {
		if out, err := s.script("conductor.sh", env, "stop"); err != nil {
			s.logf("conductor.sh stop: %v\n%s", err, out)
		}
	})
	s.conductor = fmt.Sprintf("http://127.0.0.1:%d/api", s.cfg.ConductorPort)
	return nil
}

// freeAddrs returns n distinct loopback addresses nobody listens on now:
// each probe listener stays open until all n are picked, so the kernel
// cannot hand one port out twice.
func freeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// startPostgres makes the sidecar database and its roles and returns the
// serve flags that use them.
func (s *soak) startPostgres(ctx context.Context) ([]string, error) {
	admin := s.cfg.PostgresAdminURL
	if admin == "" {
		dir := filepath.Join(s.cfg.Dir, "pg")
		env := []string{"PG_STATE_DIR=" + dir, fmt.Sprintf("PG_PORT=%d", s.cfg.PostgresPort), "PG_DATABASE=sidecar"}
		// The cluster's owner (postgres, when run as root) enters it.
		_ = os.Chmod(s.cfg.Dir, 0o755)
		s.logf("starting PostgreSQL on :%d", s.cfg.PostgresPort)
		if out, err := s.script("postgres.sh", env, "start"); err != nil {
			return nil, fmt.Errorf("deploy/local/postgres.sh start: %v\n%s", err, out)
		}
		s.stops = append(s.stops, func() {
			if out, err := s.script("postgres.sh", env, "stop"); err != nil {
				s.logf("postgres.sh stop: %v\n%s", err, out)
			}
		})
		admin = fmt.Sprintf("postgres://sidecar@127.0.0.1:%d/sidecar?sslmode=disable", s.cfg.PostgresPort)
	}
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		return nil, err
	}
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	owner, runtime, ret, db := "soak_o"+suffix, "soak_r"+suffix, "soak_d"+suffix, "soak_"+suffix
	cmd := exec.CommandContext(ctx, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "owner="+owner, "-v", "runtime="+runtime,
		"-v", "retention="+ret, "-v", "database="+db, "-f", filepath.Join(s.cfg.Root, "deploy", "postgres", "roles.sql"),
		"-h", cfg.Host, "-p", fmt.Sprint(cfg.Port), "-U", cfg.User, "-d", cfg.Database)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("psql -f deploy/postgres/roles.sql: %v\n%s", err, out)
	}
	url := func(user string) string {
		return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", user, cfg.Host, cfg.Port, db)
	}
	s.stops = append(s.stops, func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		for _, r := range []string{owner, runtime, ret} {
			_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
		}
	})
	if out, err := exec.CommandContext(ctx, s.cfg.Sidecar, "migrate", "--store", url(owner), "--runtime-role", runtime,
		"--retention-role", ret).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sidecar migrate: %v\n%s", err, out)
	}
	s.pgAdmin, s.pgDB, s.pgOwner = admin, db, url(owner)
	return []string{"--store", url(runtime), "--retention-store", url(ret)}, nil
}

func (s *soak) startServe(ctx context.Context) error {
	var extra []string
	if s.cfg.Postgres {
		var err error
		if extra, err = s.startPostgres(ctx); err != nil {
			return err
		}
	}
	addrs, err := freeAddrs(3)
	if err != nil {
		return err
	}
	listen, natsAddr, pprofAddr := addrs[0], addrs[1], addrs[2]
	pw := filepath.Join(s.cfg.Dir, "nats.password")
	password := strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(s.cfg.Dir, "serve.log"))
	if err != nil {
		return err
	}
	args := append([]string{"serve", "--data-dir", filepath.Join(s.cfg.Dir, "data"), "--listen", listen,
		"--conductor-url", s.conductor, "--task-domain", "soak" + filepath.Base(s.cfg.Dir),
		"--worker-id", "soak", "--retain-finished", s.cfg.Window.String(),
		"--archive", "file://" + filepath.Join(s.cfg.Dir, "archive"),
		"--nats-listen", natsAddr, "--nats-password-file", pw}, extra...)
	if s.cfg.HeapProfile > 0 {
		args = append(args, "--pprof-listen", pprofAddr)
		s.pprofURL = "http://" + pprofAddr
	}
	cmd := exec.Command(s.cfg.Sidecar, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	s.serve = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.stops = append(s.stops, func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close()
	})
	s.apiURL = "http://" + listen
	deadline := time.Now().Add(3 * time.Minute)
	for {
		resp, err := s.http.Get(s.apiURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("serve exited at start (log %s)", logf.Name())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("serve not ready after 3 minutes (log %s)", logf.Name())
		}
	}
	s.nc, err = nats.Connect("nats://"+natsAddr, nats.UserInfo("sidecar", password), nats.Name("soak sampler"))
	if err != nil {
		return fmt.Errorf("connect to serve's NATS: %w", err)
	}
	s.stops = append(s.stops, s.nc.Close)
	s.js, err = jetstream.New(s.nc)
	s.logf("serve ready on %s (pid %d), Conductor %s", listen, cmd.Process.Pid, s.conductor)
	return err
}

func (s *soak) plan() map[string]any {
	steps := make([]map[string]any, s.cfg.Steps)
	for i := range steps {
		steps[i] = map[string]any{"stepId": fmt.Sprintf("s%d", i+1), "executor": map[string]any{"type": "noop"}}
		if i > 0 {
			steps[i]["dependsOn"] = []string{fmt.Sprintf("s%d", i)}
		}
	}
	return map[string]any{"planId": "soak", "planVersion": "1", "steps": steps}
}

func (s *soak) submit(ctx context.Context, plan map[string]any, i int64) {
	body, _ := json.Marshal(map[string]any{"tenantId": "t", "projectId": "p", "environmentId": "e",
		"runRequestId": fmt.Sprintf("soak-%d-%d", time.Now().UnixNano(), i), "plan": plan})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.apiURL+"/v1/runs", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		s.err.Add(1)
		return
	}
	defer resp.Body.Close()
	var out struct {
		RunID        string `json:"runId"`
		EngineRunRef string `json:"engineRunRef"`
	}
	if resp.StatusCode/100 != 2 || json.NewDecoder(resp.Body).Decode(&out) != nil || out.RunID == "" {
		s.err.Add(1)
		return
	}
	wf := out.EngineRunRef[strings.LastIndexByte(out.EngineRunRef, '/')+1:]
	s.mu.Lock()
	s.runs = append(s.runs, Run{RunID: out.RunID, WorkflowID: wf})
	s.mu.Unlock()
	s.sub.Add(1)
}

func (s *soak) run(ctx context.Context) (*Result, error) {
	res := &Result{}
	start := time.Now()
	var csvHeader []string
	var nextProfile time.Duration
	sample := func() Sample {
		sm := s.sample(ctx, time.Since(start))
		res.Samples = append(res.Samples, sm)
		if s.cfg.CSV != nil {
			if csvHeader == nil {
				csvHeader = headerOf(sm)
				fmt.Fprintln(s.cfg.CSV, strings.Join(csvHeader, ","))
			}
			fmt.Fprintln(s.cfg.CSV, strings.Join(rowOf(sm, csvHeader), ","))
		}
		s.logf("%s submitted %d (errors %d) finished %d archived %d removed %d records %d disk %.1f MB RSS %.0f MiB conductor %d (sampled in %s)",
			sm.Elapsed.Truncate(time.Second), sm.Submitted, sm.SubmitErrors, sm.Finished, sm.Archived, sm.Removed, sm.LogRecords,
			float64(sm.DiskBytes)/1e6, float64(sm.RSS)/(1<<20), sm.Conductor, (time.Since(start) - sm.Elapsed).Truncate(time.Millisecond))
		if s.pprofURL != "" && sm.Elapsed >= nextProfile {
			s.heapProfile(ctx, sm.Elapsed)
			nextProfile = sm.Elapsed.Truncate(s.cfg.HeapProfile) + s.cfg.HeapProfile
		}
		return sm
	}
	sample()

	// Submit at Rate for Duration, 16 requests at most in flight.
	plan := s.plan()
	// The steady part ends with the submissions, not when the loop below
	// notices (a slow sample delays that).
	submittedEnd := time.Since(start) + s.cfg.Duration
	sctx, cancel := context.WithTimeout(ctx, s.cfg.Duration)
	var wg sync.WaitGroup
	work := make(chan int64, 1024)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				s.submit(ctx, plan, n)
			}
		}()
	}
	go func() {
		defer close(work)
		tick := time.NewTicker(time.Duration(float64(time.Second) / s.cfg.Rate))
		defer tick.Stop()
		for n := int64(0); ; n++ {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
				select {
				case work <- n:
				default: // the API is behind by 1,024 runs: this one is not submitted
					s.err.Add(1)
				}
			}
		}
	}()
	tick := time.NewTicker(s.cfg.Sample)
	defer tick.Stop()
loop:
	for {
		select {
		case <-sctx.Done():
			break loop
		case <-tick.C:
			sample()
		}
	}
	cancel()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	s.logf("submission over: %d runs, %d not submitted; waiting up to %s for every run to leave", s.sub.Load(), s.err.Load(), s.cfg.Settle)
	settle := time.Now().Add(s.cfg.Settle)
	for {
		sm := sample()
		if sm.Removed >= sm.Submitted && sm.Active == 0 {
			break
		}
		if time.Now().After(settle) {
			s.logf("settle time over with %d of %d runs removed", sm.Removed, sm.Submitted)
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
	}
	res.Final = res.Samples[len(res.Samples)-1]
	if s.pprofURL != "" {
		s.heapProfile(ctx, time.Since(start))
	}
	s.mu.Lock()
	res.Runs = append([]Run(nil), s.runs...)
	s.mu.Unlock()
	res.Steady = steady(res.Samples, s.cfg.Window+2*retentionPass, submittedEnd)
	if err := s.check(ctx, res); err != nil {
		return res, err
	}
	return res, nil
}

// heapProfile saves serve's heap profile, after a collection, as
// Dir/heap-<seconds>.pb.gz.
func (s *soak) heapProfile(ctx context.Context, elapsed time.Duration) {
	name := filepath.Join(s.cfg.Dir, fmt.Sprintf("heap-%05d.pb.gz", int(elapsed.Seconds())))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.pprofURL+"/debug/pprof/heap?gc=1", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		s.logf("heap profile: %v", err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.logf("heap profile: %s", resp.Status)
		return
	}
	f, err := os.Create(name)
	if err == nil {
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.logf("heap profile: %v", err)
		return
	}
	s.logf("heap profile %s", name)
}

// check looks up every run in the archive and in Conductor and verifies
// the archive.
func (s *soak) check(ctx context.Context, res *Result) error {
	dir := filepath.Join(s.cfg.Dir, "archive")
	arch, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
	if err != nil {
		return fmt.Errorf("open the archive: %w", err)
	}
	defer arch.Close(ctx)
	for _, r := range res.Runs {
		if _, err := arch.Lookup(ctx, r.RunID); err != nil {
			res.NotArchived = append(res.NotArchived, r.RunID)
		}
	}
	out, err := exec.CommandContext(ctx, s.cfg.Sidecar, "archive", "verify", "--archive", "file://"+dir).CombinedOutput()
	res.VerifyOutput, res.VerifyErr = string(out), err
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan Run)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				if gone, err := s.workflowGone(ctx, r.WorkflowID); err != nil || !gone {
					mu.Lock()
					res.ConductorLeft = append(res.ConductorLeft, r.RunID)
					mu.Unlock()
				}
			}
		}()
	}
	for _, r := range res.Runs {
		next <- r
	}
	close(next)
	wg.Wait()
	return nil
}

func (s *soak) workflowGone(ctx context.Context, id string) (bool, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.conductor+"/workflow/"+id+"?includeTasks=false", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	switch resp.StatusCode {
	case http.StatusNotFound:
		return true, nil
	case http.StatusOK:
		return false, nil
	}
	return false, fmt.Errorf("GET workflow %s: %s", id, resp.Status)
}

func (s *soak) sample(ctx context.Context, elapsed time.Duration) Sample {
	sm := Sample{Elapsed: elapsed, Submitted: s.sub.Load(), SubmitErrors: s.err.Load(), Messages: map[string]int64{}}
	applyMetrics(&sm, s.metrics(ctx))
	sm.DiskBytes = dirSize(filepath.Join(s.cfg.Dir, "data"))
	sm.RSS = rss(s.serve.Process.Pid)
	sm.StreamDisk = map[string]int64{}
	lister := s.js.ListStreams(ctx)
	for info := range lister.Info() {
		sm.Messages[info.Config.Name] = int64(info.State.Msgs)
		sm.LiveBytes += int64(info.State.Bytes)
		sm.StreamDisk[info.Config.Name] = dirSize(filepath.Join(s.cfg.Dir, "data", "jetstream", "$G", "streams", info.Config.Name))
	}
	// The run list's bucket keeps a removed run's marker for 15 minutes
	// (docs/jetstream.md), so its messages lag its keys by that long.
	if kv, err := s.js.KeyValue(ctx, runListBucket); err == nil {
		if keys, err := kv.ListKeys(ctx); err == nil {
			n := int64(0)
			for range keys.Keys() {
				n++
			}
			sm.Messages["keys_"+runListBucket] = n
		}
	}
	if s.pgOwner != "" {
		s.samplePostgres(ctx, &sm)
	}
	sm.Conductor = s.conductorHolds(ctx)
	return sm
}

// samplePostgres adds the log's tables' row counts and the database's size.
func (s *soak) samplePostgres(ctx context.Context, sm *Sample) {
	c, err := pgx.Connect(ctx, s.pgOwner)
	if err != nil {
		s.logf("sample PostgreSQL: %v", err)
		return
	}
	defer c.Close(ctx)
	var size int64
	if err := c.QueryRow(ctx, "SELECT pg_database_size(current_database())").Scan(&size); err == nil {
		sm.DiskBytes += size
	}
	for _, t := range []string{"run_events", "runs", "run_snapshots", "event_ids"} {
		var n int64
		if err := c.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&n); err == nil {
			sm.Messages["pg_"+t] = n
			if t == "run_events" {
				// The exact count, not sidecar_log_records (the table
				// statistics' estimate, which follows removals seconds
				// late): what the soak judges, to the last record.
				sm.LogRecords = n
			}
		}
		if err := c.QueryRow(ctx, "SELECT pg_total_relation_size($1)", t).Scan(&n); err == nil {
			sm.Messages["pg_"+t+"_bytes"] = n
		}
	}
}

// conductorLookups is how many workflow lookups a sample has in flight.
const conductorLookups = 16

// conductorHolds advances past the oldest runs whose workflows Conductor
// no longer has and counts the rest. A sample looks up to three samples'
// worth of submissions (at least 50), conductorLookups at a time, within
// 10 s: enough to follow removal at the soak's rate and to catch up after
// a slow sample, without a slow Conductor stretching the sampling.
func (s *soak) conductorHolds(ctx context.Context) int64 {
	s.mu.Lock()
	runs, from := s.runs, s.goneUpTo
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	end := min(len(runs), from+max(50, int(3*s.cfg.Rate*s.cfg.Sample.Seconds())))
	i := from
	for i < end {
		chunk := runs[i:min(end, i+conductorLookups)]
		gone := make([]bool, len(chunk))
		var wg sync.WaitGroup
		for j, r := range chunk {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := s.workflowGone(ctx, r.WorkflowID)
				gone[j] = err == nil && g
			}()
		}
		wg.Wait()
		n := 0
		for n < len(gone) && gone[n] {
			n++
		}
		i += n
		if n < len(chunk) {
			break
		}
	}
	s.mu.Lock()
	s.goneUpTo = i
	s.mu.Unlock()
	return int64(len(runs) - i)
}

// applyMetrics sets sm's columns read from serve's /metrics (m). The
// counters and sidecar_runs_active exist from serve's start, absent means
// 0; the log's size and the heap come from collectors that can miss a
// scrape (the log's size gives up after 2 s), so absent is Missing.
func applyMetrics(sm *Sample, m map[string]float64) {
	sm.Started, sm.Finished = int64(m["sidecar_run_starts_total"]), int64(m["sidecar_run_watcher_terminal_total"])
	sm.Archived, sm.Removed = int64(m["sidecar_retention_runs_archived_total"]), int64(m["sidecar_retention_runs_removed_total"])
	sm.Active = int64(m["sidecar_runs_active"])
	for _, c := range []struct {
		column, metric string
		v              *int64
	}{
		{"log_records", "sidecar_log_records", &sm.LogRecords},
		{"log_bytes", "sidecar_log_bytes", &sm.LogBytes},
		{"heap_inuse_bytes", "go_memstats_heap_inuse_bytes", &sm.HeapInuse},
	} {
		v, ok := m[c.metric]
		if !ok {
			sm.Missing = append(sm.Missing, c.column)
		}
		*c.v = int64(v)
	}
	sm.Runtime = map[string]int64{}
	for _, c := range runtimeColumns {
		v, ok := m[c.metric]
		if !ok {
			sm.Missing = append(sm.Missing, c.column)
		}
		sm.Runtime[c.column] = int64(v)
	}
}

// runtimeColumns are the Go runtime's metrics each sample records (the
// client library's Go collector, served by serve's /metrics).
var runtimeColumns = []struct{ column, metric string }{
	{"heap_alloc_bytes", "go_memstats_heap_alloc_bytes"},
	{"heap_objects", "go_memstats_heap_objects"},
	{"heap_idle_bytes", "go_memstats_heap_idle_bytes"},
	{"heap_released_bytes", "go_memstats_heap_released_bytes"},
	{"next_gc_bytes", "go_memstats_next_gc_bytes"},
	{"stack_inuse_bytes", "go_memstats_stack_inuse_bytes"},
	{"gc_count", "go_gc_duration_seconds_count"},
	{"goroutines", "go_goroutines"},
}

// metrics reads serve's /metrics: each family's samples summed over labels.
func (s *soak) metrics(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.apiURL+"/metrics", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		s.logf("metrics: %v", err)
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = line[:i]
			_, rest, ok = strings.Cut(line[strings.LastIndexByte(line, '}')+1:], " ")
		}
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64); err == nil {
			out[name] += v
		}
	}
	return out
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// values returns a sample's quantities by name (the CSV's columns).
func values(sm Sample) map[string]float64 {
	v := map[string]float64{
		"elapsed_s": sm.Elapsed.Seconds(), "submitted": float64(sm.Submitted), "submit_errors": float64(sm.SubmitErrors),
		"started": float64(sm.Started), "finished": float64(sm.Finished), "archived": float64(sm.Archived),
		"removed": float64(sm.Removed), "active": float64(sm.Active), "log_records": float64(sm.LogRecords),
		"log_bytes": float64(sm.LogBytes), "disk_bytes": float64(sm.DiskBytes), "rss_bytes": float64(sm.RSS),
		"conductor_workflows": float64(sm.Conductor), "live_bytes": float64(sm.LiveBytes), "heap_inuse_bytes": float64(sm.HeapInuse),
	}
	for k, n := range sm.Messages {
		v["msgs_"+k] = float64(n)
	}
	for k, n := range sm.StreamDisk {
		v["disk_"+k] = float64(n)
	}
	for k, n := range sm.Runtime {
		v[k] = float64(n)
	}
	for _, k := range sm.Missing {
		v[k] = math.NaN()
	}
	return v
}

var fixedColumns = []string{"elapsed_s", "submitted", "submit_errors", "started", "finished", "archived", "removed", "active",
	"log_records", "log_bytes", "disk_bytes", "rss_bytes", "conductor_workflows", "live_bytes", "heap_inuse_bytes"}

func headerOf(sm Sample) []string {
	var streams []string
	for k := range sm.Messages {
		streams = append(streams, "msgs_"+k)
	}
	for k := range sm.StreamDisk {
		streams = append(streams, "disk_"+k)
	}
	sort.Strings(streams)
	h := append([]string(nil), fixedColumns...)
	for _, c := range runtimeColumns {
		h = append(h, c.column)
	}
	return append(h, streams...)
}

func rowOf(sm Sample, header []string) []string {
	v := values(sm)
	row := make([]string, len(header))
	for i, h := range header {
		row[i] = strconv.FormatFloat(v[h], 'f', -1, 64)
	}
	return row
}

// cumulative are the columns that count since the start; they are not
// expected to be flat.
var cumulative = map[string]bool{"elapsed_s": true, "submitted": true, "submit_errors": true, "started": true,
	"finished": true, "archived": true, "removed": true, "gc_count": true}

// steady returns the series of the samples taken in [from, to].
func steady(samples []Sample, from, to time.Duration) []Series {
	var in []Sample
	for _, sm := range samples {
		if sm.Elapsed >= from && sm.Elapsed <= to {
			in = append(in, sm)
		}
	}
	if len(in) == 0 {
		return nil
	}
	var out []Series
	for _, name := range headerOf(in[0]) {
		if cumulative[name] {
			continue
		}
		s := Series{Name: name, Min: math.Inf(1), Max: math.Inf(-1)}
		var xs []float64
		for _, sm := range in {
			if x := values(sm)[name]; !math.IsNaN(x) {
				xs = append(xs, x)
			}
		}
		for _, x := range xs {
			s.Min, s.Max, s.Mean = math.Min(s.Min, x), math.Max(s.Max, x), s.Mean+x/float64(len(xs))
		}
		// A series no sample knows is not flat: it is unknown.
		s.Flat = len(xs) > 0 && (s.Max <= s.Mean*(1+FlatTolerance) && s.Min >= s.Mean*(1-FlatTolerance) || s.Max-s.Min <= FlatSlack)
		s.Judged = judged(name)
		out = append(out, s)
	}
	return out
}

// Summary writes the result for a reader: the steady series, the verdict,
// and the end state.
func (r *Result) Summary(w io.Writer) {
	fmt.Fprintf(w, "%-40s %14s %14s %8s %s\n", "series (steady part)", "min", "max", "max/min", "flat (within ±15% of mean, or ±10)")
	for _, s := range r.Steady {
		note := ""
		if !s.Judged {
			note = " (shown, not judged)"
		}
		fmt.Fprintf(w, "%-40s %14.0f %14.0f %8.3f %v%s\n", s.Name, s.Min, s.Max, s.Ratio(), s.Flat, note)
	}
	f := r.Final
	fmt.Fprintf(w, "runs submitted %d (not submitted %d), started %d, finished %d, archived %d, removed %d\n",
		f.Submitted, f.SubmitErrors, f.Started, f.Finished, f.Archived, f.Removed)
	fmt.Fprintf(w, "at the end: log records %d, runs not in the archive %d, workflows left in Conductor %d\n",
		f.LogRecords, len(r.NotArchived), len(r.ConductorLeft))
	verify := "clean"
	if r.VerifyErr != nil {
		verify = "FAILED: " + r.VerifyErr.Error()
	}
	fmt.Fprintf(w, "archive verify: %s\n%s", verify, r.VerifyOutput)
	verdict := "FLAT"
	if !r.Flat() {
		verdict = "NOT FLAT"
	}
	ok := r.Flat() && len(r.NotArchived) == 0 && len(r.ConductorLeft) == 0 && r.VerifyErr == nil
	fmt.Fprintf(w, "verdict: %s after the first retention window; every run archived %v; archive verify clean %v; Conductor's copies removed %v; PASS %v\n",
		verdict, len(r.NotArchived) == 0, r.VerifyErr == nil, len(r.ConductorLeft) == 0, ok)
}
