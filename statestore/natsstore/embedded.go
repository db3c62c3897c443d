package natsstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// EmbeddedConfig configures StartEmbedded.
type EmbeddedConfig struct {
	// DataDir is the JetStream store directory (required). It survives
	// restarts; two servers must not share it.
	DataDir string
	// Port is the client port on 127.0.0.1: 0 means 4222, -1 a random
	// free port (tests).
	Port int
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
}

// StartEmbedded starts a NATS server with JetStream in this process,
// listening on 127.0.0.1 only, and returns once it accepts connections.
// Stop it with Shutdown and WaitForShutdown.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("natsstore: embedded server needs a data dir")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	opts := &server.Options{
		ServerName:   "sidecar",
		Host:         "127.0.0.1",
		Port:         cfg.Port,
		JetStream:    true,
		StoreDir:     cfg.DataDir,
		SyncAlways:   cfg.SyncInterval <= 0,
		SyncInterval: cfg.SyncInterval,
		NoSigs:       true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	srv.SetLoggerV2(serverLogger{cfg.Logger.Named("nats").Sugar()}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(cfg.ReadyTimeout) {
		srv.Shutdown()
		return nil, fmt.Errorf("nats server not ready within %s", cfg.ReadyTimeout)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return nil, fmt.Errorf("jetstream did not start on %s (see the server log)", cfg.DataDir)
	}
	return srv, nil
}

// ConnectEmbedded connects to srv in-process, without a network socket.
func ConnectEmbedded(srv *server.Server, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name("sidecar"), nats.InProcessServer(srv)}, opts...)
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}
	return nc, nil
}

// serverLogger adapts zap to the nats-server logger. Fatalf logs at error
// level: an embedded server must not exit the process.
type serverLogger struct{ l *zap.SugaredLogger }

func (s serverLogger) Noticef(format string, v ...any) { s.l.Infof(format, v...) }
func (s serverLogger) Warnf(format string, v ...any)   { s.l.Warnf(format, v...) }
func (s serverLogger) Fatalf(format string, v ...any)  { s.l.Errorf(format, v...) }
func (s serverLogger) Errorf(format string, v ...any)  { s.l.Errorf(format, v...) }
func (s serverLogger) Debugf(format string, v ...any)  { s.l.Debugf(format, v...) }
func (s serverLogger) Tracef(format string, v ...any)  { s.l.Debugf(format, v...) }
