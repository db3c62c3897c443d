package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestStartEmbedded_Listener(t *testing.T) {
	t.Run("NoneByDefault", func(t *testing.T) {
		_, srv := natstest.Start(t)
		if addr := srv.Addr(); addr != nil {
			t.Fatalf("embedded server listens on %s, want no listener", addr)
		}
		if srv.URL() != "" {
			t.Fatalf("URL without a listener: %q", srv.URL())
		}
	})
	t.Run("NeedsPassword", func(t *testing.T) {
		_, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
		if err == nil || !strings.Contains(err.Error(), "password") {
			t.Fatalf("listener without a password: %v", err)
		}
	})
	t.Run("Authenticated", func(t *testing.T) {
		_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "replica-pw"})
		addr := srv.Addr().String()
		for _, opt := range []nats.Option{nil, nats.UserInfo(natsstore.SidecarUser, "wrong")} {
			opts := []nats.Option{nats.MaxReconnects(0)}
			if opt != nil {
				opts = append(opts, opt)
			}
			if nc, err := nats.Connect("nats://"+addr, opts...); err == nil {
				nc.Close()
				t.Fatalf("connected to the listener without the password")
			} else if !errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("connect without the password: %v, want an authorization violation", err)
			}
		}
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatalf("replica with the password: %v", err)
		}
		nc.Close()
	})
}

// TestEmbedded_LeastPrivilege: the sidecar's own user, as serve connects
// it, cannot delete, purge or reconfigure the log or delete a record.
func TestEmbedded_LeastPrivilege(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.Start(t)
	nc, err := srv.Connect(nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("Open under least privilege: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	mustAppend(t, s, storetest.Event("run-lp", statestore.RunStarted, ""))
	// Open again binds to the stream it cannot update.
	if s2, err := natsstore.Open(ctx, js, natsstore.Options{}); err != nil {
		t.Fatalf("reopen under least privilege: %v", err)
	} else {
		_ = s2.Close()
	}
	natstest.RequireNoRewrite(t, js, natsstore.DefaultStateBucket)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("log after the refused operations: %v", err)
	}
}

func TestLockDataDir(t *testing.T) {
	dir := t.TempDir()
	unlock, err := natsstore.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = natsstore.LockDataDir(dir)
	if !errors.Is(err, natsstore.ErrDataDirLocked) || !strings.Contains(err.Error(), fmt.Sprintf("pid=%d", os.Getpid())) {
		t.Fatalf("second lock: %v, want ErrDataDirLocked naming pid %d", err, os.Getpid())
	}
	if _, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: dir}); !errors.Is(err, natsstore.ErrDataDirLocked) {
		t.Fatalf("server on a locked dir: %v, want ErrDataDirLocked", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	unlock, err = natsstore.LockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	_ = unlock()
	// A file where the directory should be is not usable.
	file := dir + "/file"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natsstore.LockDataDir(file); !errors.Is(err, natsstore.ErrDataDirUnusable) {
		t.Fatalf("lock of a file: %v, want ErrDataDirUnusable", err)
	}
	if err := natsstore.CheckFreeSpace(dir, 1<<62); !errors.Is(err, natsstore.ErrDataDirUnusable) {
		t.Fatalf("free space below an absurd minimum: %v", err)
	}
}
