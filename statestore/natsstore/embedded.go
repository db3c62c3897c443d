package natsstore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// SidecarUser is the NATS user the sidecar connects as, to its embedded
// server and (by convention, see deploy/nats) to an external one.
const SidecarUser = "sidecar"

// EmbeddedConfig configures StartEmbedded.
type EmbeddedConfig struct {
	// DataDir is the JetStream store directory (required). It survives
	// restarts. StartEmbedded takes an exclusive lock on it (LockDataDir):
	// a second server on the same directory fails at once.
	DataDir string
	// Listen is the TCP address other replicas connect to, e.g.
	// 10.0.0.5:4222 or 127.0.0.1:0 (a free port). Empty, the default,
	// opens no listener: only connections made in this process (Connect)
	// reach the server, so no other local process can read or write the log.
	Listen string
	// Password is the password of SidecarUser. With a listener it is
	// required (other replicas present it); without one, an empty Password
	// gets a random one that never leaves the process.
	Password string
	// Permissions limit SidecarUser (nil: Permissions(DefaultSubjectPrefix),
	// the least privilege the sidecar needs). Tests may pass AllPermissions.
	Permissions *server.Permissions
	// RetentionPassword is the password of RetentionUser, who may remove
	// finished runs (RetentionPermissions). Empty: a random one that never
	// leaves the process (ConnectRetention uses it).
	RetentionPassword string
	// RetentionPermissions limit RetentionUser (nil:
	// RetentionPermissions(DefaultStream, DefaultStateBucket,
	// DefaultSnapshotBucket)).
	RetentionPermissions *server.Permissions
	// SyncInterval is how often the file store fsyncs. Zero, the default,
	// fsyncs every write before it is acknowledged ("sync_interval:
	// always"), so an acknowledged event survives a power loss. A positive
	// interval (the nats-server default is 2m) is several times faster, but
	// a power loss can drop events acknowledged within the last interval; a
	// crash of the process alone loses nothing either way.
	SyncInterval time.Duration
	// Logger receives the server's log (default nop).
	Logger *zap.Logger
	// ReadyTimeout bounds the wait for the server to accept connections
	// (default 10s).
	ReadyTimeout time.Duration
	// MinFreeBytes is the free space the data dir's file system must keep
	// (default DefaultMinFreeBytes): StartEmbedded refuses to start below
	// it and Check reports it.
	MinFreeBytes uint64
}

// AllPermissions lets SidecarUser do everything: for tests that play an
// administrator (delete a stream to see it detected). Never for serve.
var AllPermissions = &server.Permissions{
	Publish:   &server.SubjectPermission{Allow: []string{">"}},
	Subscribe: &server.SubjectPermission{Allow: []string{">"}},
}

// Permissions returns the least privilege the sidecar needs on a server
// whose account holds only the sidecar's streams, buckets and object
// stores, with the event stream on subjects prefix.>. The JetStream API is
// allowed except what could remove or rewrite data or configuration:
// stream delete, purge, update, message delete, snapshot and restore, peer
// removal and the meta/server APIs. Publishing to the stream's appended
// notifications (prefix-appended.>) is denied, so a runSeq or persistedAt
// cannot be forged there. deploy/nats/sidecar.conf writes the same rules
// for an external server; TestSidecarConf_LeastPrivilege checks both.
// publish adds subjects the sidecar publishes to besides its own: the
// event bus's NATS sinks (<prefix>.events.>).
func Permissions(prefix string, publish ...string) *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{
			Allow: append([]string{"$JS.API.>", "$KV.>", "$O.>", prefix + ".>", "$JS.ACK.>", "$JS.FC.>", "_INBOX.>"}, publish...),
			Deny:  append(DeniedAPI(), prefix+appendedSuffix+".>"),
		},
		Subscribe: &server.SubjectPermission{
			Allow: []string{"_INBOX.>", prefix + appendedSuffix + ".>"},
		},
	}
}

// DeniedAPI lists the JetStream API subjects the sidecar's user must not
// publish to: everything that deletes, purges or reconfigures a stream or
// bucket, or the server.
func DeniedAPI() []string {
	return []string{
		"$JS.API.STREAM.DELETE.>",
		"$JS.API.STREAM.PURGE.>",
		"$JS.API.STREAM.UPDATE.>",
		"$JS.API.STREAM.MSG.DELETE.>",
		"$JS.API.STREAM.SNAPSHOT.>",
		"$JS.API.STREAM.RESTORE.>",
		"$JS.API.STREAM.PEER.REMOVE.>",
		"$JS.API.ACCOUNT.PURGE.>",
		"$JS.API.META.>",
		"$JS.API.SERVER.>",
	}
}

// Embedded is a NATS server with JetStream running in this process.
type Embedded struct {
	*server.Server
	dir      string
	minFree  uint64
	password string
	// retentionPassword is RetentionUser's.
	retentionPassword string
	unlock            func() error
	once              sync.Once
	// refusals is what Check (or a write's recheck) last found: the
	// streams that hold a write error, read by every write (writeGuard).
	refusals atomic.Pointer[map[string]*WriteRefusedError]
}

var _ writeRefusals = (*Embedded)(nil)

// StartEmbedded locks cfg.DataDir, starts a NATS server with JetStream in
// this process and returns once it accepts connections. Every client,
// in-process or not, authenticates as SidecarUser. Stop it with Shutdown.
//
// It fails with ErrDataDirLocked when another process holds the data dir,
// and otherwise with the server's own last error (read-only or full disk,
// damaged store) rather than a bare time-out.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("natsstore: embedded server needs a data dir")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	if cfg.Permissions == nil {
		cfg.Permissions = Permissions(DefaultSubjectPrefix)
	}
	if cfg.MinFreeBytes == 0 {
		cfg.MinFreeBytes = DefaultMinFreeBytes
	}
	opts := &server.Options{
		ServerName:      "sidecar",
		JetStream:       true,
		StoreDir:        cfg.DataDir,
		SyncAlways:      cfg.SyncInterval <= 0,
		SyncInterval:    cfg.SyncInterval,
		NoSigs:          true,
		NoSystemAccount: true,
	}
	if cfg.Listen == "" {
		opts.DontListen = true
		if cfg.Password == "" {
			cfg.Password = randomPassword()
		}
	} else {
		if cfg.Password == "" {
			return nil, errors.New("natsstore: a listener for other replicas needs a password for user " + SidecarUser)
		}
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsstore: listen address %q: %w", cfg.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return nil, fmt.Errorf("natsstore: listen address %q: bad port", cfg.Listen)
		}
		if p == 0 {
			p = -1 // nats-server: -1 is a random port, 0 its default 4222
		}
		opts.Host, opts.Port = host, p
	}
	if cfg.RetentionPassword == "" {
		cfg.RetentionPassword = randomPassword()
	}
	if cfg.RetentionPermissions == nil {
		cfg.RetentionPermissions = RetentionPermissions(DefaultStream, DefaultStateBucket, DefaultSnapshotBucket)
	}
	opts.Users = []*server.User{
		{Username: SidecarUser, Password: cfg.Password, Permissions: cfg.Permissions},
		{Username: RetentionUser, Password: cfg.RetentionPassword, Permissions: cfg.RetentionPermissions},
	}
	unlock, err := LockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := CheckFreeSpace(cfg.DataDir, cfg.MinFreeBytes); err != nil {
		_ = unlock()
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		_ = unlock()
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	logs := &serverLogger{l: cfg.Logger.Named("nats").Sugar()}
	srv.SetLoggerV2(logs, false, false, false)
	srv.Start()
	e := &Embedded{Server: srv, password: cfg.Password, retentionPassword: cfg.RetentionPassword, unlock: unlock, dir: cfg.DataDir, minFree: cfg.MinFreeBytes}
	if !srv.ReadyForConnections(cfg.ReadyTimeout) {
		e.Shutdown()
		return nil, fmt.Errorf("nats server on %s not ready within %s%s", cfg.DataDir, cfg.ReadyTimeout, logs.lastError())
	}
	if !srv.JetStreamEnabled() {
		e.Shutdown()
		return nil, fmt.Errorf("jetstream did not start on %s%s", cfg.DataDir, logs.lastError())
	}
	return e, nil
}

// Shutdown stops the server, waits for it, and releases the data dir.
// It may be called more than once.
func (e *Embedded) Shutdown() {
	e.once.Do(func() {
		e.Server.Shutdown()
		e.Server.WaitForShutdown()
		_ = e.unlock()
	})
}

// Check reports whether the server can store now: JetStream enabled (the
// server disables it when a write fails for lack of space), no stream
// holding a write error, and the data dir's file system above its minimum
// free space.
//
// A stream whose file store failed a write (a full disk, a file size
// limit) refuses every later write, and the server keeps that error until
// it restarts, even once space is freed: Check reports it from the
// server's own health report (its stream write errors), which reads no
// message and writes nothing, as a *WriteRefusedError. Check also keeps
// what it found for the store's writes on this server's connections
// (Connect): a write to such a stream then fails at once with
// STORE_WRITE_REFUSED instead of waiting out its timeout.
func (e *Embedded) Check() error {
	if !e.Server.JetStreamEnabled() {
		return errors.New("jetstream is disabled on the embedded server (see its log: a failed write disables it)")
	}
	if err := e.checkWriteErrors(); err != nil {
		return err
	}
	return CheckFreeSpace(e.dir, e.minFree)
}

// checkWriteErrors asks the server which streams hold a write error,
// keeps the answer for the store's writes (writeGuard) and reports the
// first such stream of the server's health report.
func (e *Embedded) checkWriteErrors() error {
	if r := e.findRefusals(""); r != nil {
		return r
	}
	return nil
}

// findRefusals reads the server's health report, keeps every stream it
// names with a write error, and returns stream's (any stream's, for "":
// the first named) as a copy, or nil.
func (e *Embedded) findRefusals(stream string) *WriteRefusedError {
	h := e.Server.Healthz(&server.HealthzOptions{Details: true})
	found := map[string]*WriteRefusedError{}
	var first *WriteRefusedError
	for _, he := range h.Errors {
		if he.Type != server.HealthzErrorStream || !strings.Contains(he.Error, "write error") {
			continue
		}
		r := &WriteRefusedError{Stream: he.Stream, Cause: he.Error, DataDir: e.dir}
		found[he.Stream] = r
		if first == nil {
			first = r
		}
	}
	e.refusals.Store(&found)
	if stream != "" {
		first = found[stream]
	}
	if first == nil {
		return nil
	}
	c := *first
	return &c
}

// refused implements writeRefusals: what Check last found about stream.
func (e *Embedded) refused(stream string) *WriteRefusedError {
	m := e.refusals.Load()
	if m == nil {
		return nil
	}
	r := (*m)[stream]
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// recheck implements writeRefusals: ask the server now.
func (e *Embedded) recheck(stream string) *WriteRefusedError { return e.findRefusals(stream) }

// Connect connects to the server in-process, as SidecarUser.
func (e *Embedded) Connect(opts ...nats.Option) (*nats.Conn, error) {
	// e itself is the in-process provider: the store's writes on the
	// connection find the server's write errors through it (guardOf).
	opts = append([]nats.Option{nats.Name("sidecar"), nats.InProcessServer(e), nats.UserInfo(SidecarUser, e.password)}, opts...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}
	return nc, nil
}

// ConnectRetention connects to the server in-process as RetentionUser,
// for retention's Remover and nothing else.
func (e *Embedded) ConnectRetention(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name("sidecar retention"), nats.InProcessServer(e), nats.UserInfo(RetentionUser, e.retentionPassword)}, opts...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats as %s: %w", RetentionUser, err)
	}
	return nc, nil
}

func randomPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// serverLogger adapts zap to the nats-server logger and keeps the last
// error line, for the start-up failure message. Fatalf logs at error
// level: an embedded server must not exit the process.
type serverLogger struct {
	l    *zap.SugaredLogger
	mu   sync.Mutex
	last string
	// seen bounds repeated errors and warnings: one line per format a
	// minute (a client repeating a refused request would otherwise log a
	// line per request), the next one saying how many were left out.
	seen map[string]*repeats
}

type repeats struct {
	at      time.Time
	skipped int
}

// repeatEvery is how often one kind of server error or warning is logged.
const repeatEvery = time.Minute

func (s *serverLogger) Noticef(format string, v ...any) { s.l.Infof(format, v...) }
func (s *serverLogger) Warnf(format string, v ...any) {
	if strings.HasPrefix(format, "Plaintext passwords detected") {
		// The embedded server's users are the sidecar's own, configured
		// in memory by this process (their passwords made at each start,
		// or read from --nats-password-file): there is no configuration
		// file holding a password in the clear, which is what the
		// warning is about, and nothing for an operator to do.
		return
	}
	if sfx, ok := s.bounded(format); ok {
		s.l.Warnf(format+sfx, v...)
	}
}
func (s *serverLogger) Fatalf(format string, v ...any) { s.keep(format, v); s.l.Errorf(format, v...) }
func (s *serverLogger) Errorf(format string, v ...any) {
	s.keep(format, v)
	if sfx, ok := s.bounded(format); ok {
		s.l.Errorf(format+sfx, v...)
	}
}
func (s *serverLogger) Debugf(format string, v ...any) { s.l.Debugf(format, v...) }
func (s *serverLogger) Tracef(format string, v ...any) { s.l.Debugf(format, v...) }

func (s *serverLogger) keep(format string, v []any) {
	s.mu.Lock()
	s.last = fmt.Sprintf(format, v...)
	s.mu.Unlock()
}

// bounded reports whether a line of format is due (ok), with a suffix
// counting the lines of that format left out since the last one.
func (s *serverLogger) bounded(format string) (suffix string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string]*repeats{}
	}
	now := time.Now()
	r := s.seen[format]
	if r != nil && now.Sub(r.at) < repeatEvery {
		r.skipped++
		return "", false
	}
	if r != nil && r.skipped > 0 {
		suffix = fmt.Sprintf(" (and %d more like it in the last %s)", r.skipped, repeatEvery)
	}
	if len(s.seen) > 1000 { // formats carry a connection's name: keep the map small
		clear(s.seen)
	}
	s.seen[format] = &repeats{at: now}
	return strings.ReplaceAll(suffix, "%", "%%"), true
}

// lastError is ": <the server's last error>", or "" when it logged none.
func (s *serverLogger) lastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == "" {
		return ""
	}
	return ": " + strings.TrimSpace(s.last)
}

// URL is the listener's URL with SidecarUser's credentials in it, for
// another replica (tests); empty when the server has no listener.
func (e *Embedded) URL() string {
	addr := e.Server.Addr()
	if addr == nil {
		return ""
	}
	u := url.URL{Scheme: "nats", User: url.UserPassword(SidecarUser, e.password), Host: addr.String()}
	return u.String()
}
