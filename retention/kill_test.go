package retention_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// Environment of the child process of TestRetention_KillDashNine.
const (
	killDirEnv = "RETENTION_KILL_DIR"
	killAtEnv  = "RETENTION_KILL_AT"
)

// openHotIn is newHot on the data dir dir/nats (made when fresh), with
// the archive in dir/archive: a process that opens it again finds the
// same log, ledger and archive.
func openHotIn(t *testing.T, dir string, fresh bool, finished, open int) *hot {
	t.Helper()
	ctx := context.Background()
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := &hot{t: t, srv: srv, js: js, store: s, finished: map[string][]statestore.RunEventRecord{}, dir: filepath.Join(dir, "archive")}
	for i := range finished + open {
		id := fmt.Sprintf("run-%d", i)
		if fresh {
			events := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1"), storetest.Event(id, statestore.StepCompleted, "s1")}
			if i < finished {
				events = append(events, storetest.Event(id, statestore.RunCompleted, ""))
			}
			for _, w := range events {
				if _, err := s.Append(ctx, w); err != nil {
					t.Fatal(err)
				}
			}
		}
		if i >= finished {
			h.open = append(h.open, id)
		}
	}
	return h
}

// TestRetention_KillDashNine kills (SIGKILL) a process in the middle of
// a retention pass, at each of several points, and checks from a new
// process on the same data dir and archive that no run was lost, then
// that a new pass finishes the job. The in-process stops of
// TestRetention_CrashAtEachStep cover every step; this covers what only a
// real kill shows (the server's files as a dead process left them).
func TestRetention_KillDashNine(t *testing.T) {
	if os.Getenv(killDirEnv) != "" {
		t.Skip("the child's own run")
	}
	ctx := context.Background()
	for _, at := range []string{"segment-written", "archive-confirmed", "one-run-removed"} {
		t.Run(at, func(t *testing.T) {
			dir := t.TempDir()
			// Set up the log, remember the finished runs' records, close.
			setup := openHotIn(t, dir, true, 6, 2)
			expect := map[string][]statestore.RunEventRecord{}
			for i := range 6 {
				id := fmt.Sprintf("run-%d", i)
				recs, err := setup.store.Fetch(ctx, id, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				expect[id] = recs
			}
			setup.store.Close()
			setup.srv.Shutdown()

			cmd := exec.Command(os.Args[0], "-test.run=^TestRetention_KillChild$", "-test.v")
			cmd.Env = append(os.Environ(), killDirEnv+"="+dir, killAtEnv+"="+at)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child: %v, want killed by SIGKILL\n%s", err, out)
			}

			h := openHotIn(t, dir, false, 6, 2)
			h.finished = expect
			h.requireSafe(false)
			// The kill came where it was meant to.
			mid, err := archive.Verify(ctx, archive.NewDir(h.dir), archive.VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			removed := 0
			for id := range expect {
				if recs, _ := h.store.Fetch(ctx, id, 0, 0); len(recs) == 0 {
					removed++
				}
			}
			want := map[string][3]int{"segment-written": {0, 1, 0}, "archive-confirmed": {1, 0, 0}, "one-run-removed": {1, 0, 1}}[at]
			if got := [3]int{int(mid.Manifests), len(mid.Orphans), removed}; got != want {
				t.Fatalf("after the kill: %d manifests, %d orphans, %d runs removed; want %v", got[0], got[1], got[2], want)
			}
			r := h.retention(h.archive(nil), h.remover(), retention.Options{})
			if _, err := r.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			h.requireSafe(true)
			rep, err := archive.Verify(ctx, archive.NewDir(h.dir), archive.VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Runs != 6 || rep.Records != 24 {
				t.Fatalf("archive holds %d runs, %d records; want 6 and 24", rep.Runs, rep.Records)
			}
		})
	}
}

// TestRetention_KillChild is the child of TestRetention_KillDashNine: a
// retention pass that SIGKILLs its own process at RETENTION_KILL_AT.
func TestRetention_KillChild(t *testing.T) {
	dir, at := os.Getenv(killDirEnv), os.Getenv(killAtEnv)
	if dir == "" {
		t.Skip("run by TestRetention_KillDashNine")
	}
	die := func() error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
		return errors.New("not killed")
	}
	h := openHotIn(t, dir, false, 0, 0)
	dest := &killDest{Dir: archive.NewDir(h.dir)}
	arch := h.archive(dest)
	var a retention.Archive = arch
	var rm retention.Remover = h.remover()
	switch at {
	case "segment-written":
		dest.afterSegment = die
	case "archive-confirmed":
		a = killAfterWrite{arch, die}
	case "one-run-removed":
		rm = killAfterRemove{rm, die}
	}
	r := h.retention(a, rm, retention.Options{BatchRuns: 3})
	_, err := r.Pass(context.Background())
	t.Fatalf("the pass ended without being killed: %v", err)
}

// killDest dies after a segment is written.
type killDest struct {
	*archive.Dir
	afterSegment func() error
}

func (d *killDest) Put(ctx context.Context, name string, b []byte) error {
	if err := d.Dir.Put(ctx, name, b); err != nil {
		return err
	}
	if d.afterSegment != nil {
		return d.afterSegment()
	}
	return nil
}

type killAfterWrite struct {
	*archive.Archive
	die func() error
}

func (k killAfterWrite) Write(ctx context.Context, runs []archive.Run) (*archive.Manifest, error) {
	if _, err := k.Archive.Write(ctx, runs); err != nil {
		return nil, err
	}
	return nil, k.die()
}

type killAfterRemove struct {
	retention.Remover
	die func() error
}

func (k killAfterRemove) RemoveRun(ctx context.Context, runID string, last, n uint64) error {
	if err := k.Remover.RemoveRun(ctx, runID, last, n); err != nil {
		return err
	}
	return k.die()
}
