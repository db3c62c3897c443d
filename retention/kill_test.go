package retention_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// killBackendEnv names the backend of the child process of
// TestRetention_KillDashNine, and killAtEnv where it kills itself; the
// backend's own variables say where its log is.
const (
	killBackendEnv = "RETENTION_KILL_BACKEND"
	killAtEnv      = "RETENTION_KILL_AT"
)

// TestRetention_KillDashNine kills (SIGKILL) a process in the middle of
// a retention pass, at each of several points, and checks from a new
// process on the same log and archive that no run was lost, then that a
// new pass finishes the job. The in-process stops of
// TestRetention_CrashAtEachStep cover every step; this covers what only a
// real kill shows (the log's files or rows as a dead process left them).
func TestRetention_KillDashNine(t *testing.T) {
	if os.Getenv(killBackendEnv) != "" {
		t.Skip("the child's own run")
	}
	eachBackend(t, testKillDashNine)
}

func testKillDashNine(t *testing.T, b *backend) {
	ctx := context.Background()
	for _, at := range []string{"segment-written", "archive-confirmed", "batch-removed"} {
		t.Run(at, func(t *testing.T) {
			// Set up the log, remember its runs, close it.
			addr := b.create(t)
			get := func(k string) string { return addr[k] }
			setup := b.open(t, get)
			setup.populate(6, 2, nil)
			setup.close()

			cmd := exec.Command(os.Args[0], "-test.run=^TestRetention_KillChild$", "-test.v")
			cmd.Env = append(os.Environ(), killBackendEnv+"="+b.name, killAtEnv+"="+at)
			for k, v := range addr {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child: %v, want killed by SIGKILL\n%s", err, out)
			}

			h := b.open(t, get)
			h.finished, h.open = setup.finished, setup.open
			h.requireSafe(false)
			// The kill came where it was meant to.
			mid, err := archive.Verify(ctx, archive.NewDir(h.dir), archive.VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			removed := 0
			for id := range h.finished {
				if recs, _ := h.store.Fetch(ctx, id, 0, 0); len(recs) == 0 {
					removed++
				}
			}
			want := map[string][3]int{"segment-written": {0, 1, 0}, "archive-confirmed": {1, 0, 0}, "batch-removed": {1, 0, 3}}[at]
			if got := [3]int{int(mid.Manifests), len(mid.Orphans), removed}; got != want {
				t.Fatalf("after the kill: %d manifests, %d orphans, %d runs removed; want %v", got[0], got[1], got[2], want)
			}
			restart(t, h, b)
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
// retention pass on the log of RETENTION_KILL_BACKEND that SIGKILLs its
// own process at RETENTION_KILL_AT.
func TestRetention_KillChild(t *testing.T) {
	name, at := os.Getenv(killBackendEnv), os.Getenv(killAtEnv)
	if name == "" {
		t.Skip("run by TestRetention_KillDashNine")
	}
	b := backendNamed(name)
	if b == nil {
		t.Fatalf("%s=%q names no backend", killBackendEnv, name)
	}
	die := func() error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
		return errors.New("not killed")
	}
	h := b.open(t, os.Getenv)
	dest := &killDest{Dir: archive.NewDir(h.dir)}
	arch := h.archive(dest)
	var a retention.Archive = arch
	var rm retention.Remover = h.remover()
	switch at {
	case "segment-written":
		dest.afterSegment = die
	case "archive-confirmed":
		a = killAfterWrite{arch, die}
	case "batch-removed":
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

func (k killAfterRemove) RemoveRuns(ctx context.Context, runs []statestore.Removal) error {
	if err := k.Remover.RemoveRuns(ctx, runs); err != nil {
		return err
	}
	return k.die()
}
