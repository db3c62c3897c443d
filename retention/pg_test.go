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

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Environment of the child process of TestRetention_KillDashNinePostgres:
// the database's URLs as the runtime and the retention role.
const (
	killRuntimeEnv   = "RETENTION_KILL_PG_RUNTIME"
	killRetentionEnv = "RETENTION_KILL_PG_RETENTION"
)

// pgHot is a PostgreSQL log set up as docs/postgres.md says (owner,
// runtime and retention roles), served as the runtime role, with finished
// and open runs in it, and an archive directory.
type pgHot struct {
	t                        *testing.T
	runtimeURL, retentionURL string
	store                    *pgstore.Store
	finished                 map[string][]statestore.RunEventRecord
	open                     []string
	dir                      string
}

// newPGHot makes the database and its runs; openPGHot opens one made
// before (the child of the kill test).
func newPGHot(t *testing.T, finished, open int) *pgHot {
	t.Helper()
	ctx := context.Background()
	roles := pgtest.NewRoles(t)
	if _, err := pgstore.Migrate(ctx, roles.OwnerURL, pgstore.MigrateOptions{RuntimeRole: roles.Runtime, RetentionRole: roles.Retention}); err != nil {
		t.Fatal(err)
	}
	h := openPGHot(t, roles.RuntimeURL, roles.RetentionURL, filepath.Join(t.TempDir(), "archive"))
	for i := range finished + open {
		id := fmt.Sprintf("run-%d", i)
		events := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1"), storetest.Event(id, statestore.StepCompleted, "s1")}
		if i < finished {
			events = append(events, storetest.Event(id, statestore.RunCompleted, ""))
		}
		for _, w := range events {
			if _, err := h.store.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		recs, err := h.store.Fetch(ctx, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i < finished {
			h.finished[id] = recs
		} else {
			h.open = append(h.open, id)
		}
	}
	return h
}

// holeGrace is the log's pgstore.Options.HoleGrace: a follower passes the
// log sequences of a removed run at once when the records after them are
// older than this (in production, retention removes runs whose records
// are older than the retention period).
const holeGrace = time.Second

func openPGHot(t *testing.T, runtimeURL, retentionURL, dir string) *pgHot {
	t.Helper()
	s, err := pgstore.Open(context.Background(), runtimeURL, pgstore.Options{DurableSnapshots: true, HoleGrace: holeGrace, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &pgHot{t: t, runtimeURL: runtimeURL, retentionURL: retentionURL, store: s, finished: map[string][]statestore.RunEventRecord{}, dir: dir}
}

func (h *pgHot) remover() *pgstore.Remover {
	h.t.Helper()
	rm, err := pgstore.OpenRemover(context.Background(), h.retentionURL, pgstore.RemoverOptions{Logger: zaptest.NewLogger(h.t)})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(rm.Close)
	return rm
}

func (h *pgHot) archive(dest archive.Destination) *archive.Archive {
	h.t.Helper()
	if dest == nil {
		dest = archive.NewDir(h.dir)
	}
	a, err := archive.Open(context.Background(), dest, archive.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

// retention is a fresh loop (as after a restart), its clock two hours
// ahead of a retention period of one hour.
func (h *pgHot) retention(arch retention.Archive, rm retention.Remover, opts retention.Options) *retention.Retention {
	h.t.Helper()
	opts.RetainFinished = time.Hour
	opts.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	opts.Logger = zaptest.NewLogger(h.t)
	r, err := retention.New(h.store, arch, rm, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

// requireSafe is requireSafe on the PostgreSQL log, with sidecar verify's
// check of every run left.
func (h *pgHot) requireSafe(wantRemoved bool) {
	h.t.Helper()
	requireSafe(h.t, h.store, h.dir, h.finished, h.open, wantRemoved)
	v, err := pgstore.Verify(context.Background(), h.runtimeURL, nil)
	if err != nil || len(v.Broken) != 0 {
		h.t.Fatalf("sidecar verify: %+v %v", v, err)
	}
}

// TestRetention_Postgres: a pass on the PostgreSQL log archives every
// finished run, the archive verifies, and the runs leave the log through
// the retention role, with their snapshots and event ids; open runs stay;
// the role that serves the log still cannot delete a record.
func TestRetention_Postgres(t *testing.T) {
	ctx := context.Background()
	h := newPGHot(t, 5, 2)
	for id := range h.finished { // a saved snapshot and an event id each
		if _, err := h.store.ProjectSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := h.store.Pool().Exec(ctx, "INSERT INTO event_ids VALUES ($1, 'k', gen_random_uuid())", id); err != nil {
			t.Fatal(err)
		}
	}
	r := h.retention(h.archive(nil), h.remover(), retention.Options{BatchRuns: 2})
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Archived != 5 || res.Removed != 5 {
		t.Fatalf("got %+v, want 5 archived and removed", res)
	}
	h.requireSafe(true)
	rep, err := archive.Verify(ctx, archive.NewDir(h.dir), archive.VerifyOptions{})
	if err != nil || len(rep.Problems) != 0 || rep.Runs != 5 || rep.Records != 20 {
		t.Fatalf("archive verify: %+v %v, want 5 runs, 20 records", rep, err)
	}
	var left int
	if err := h.store.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM run_snapshots WHERE run_id NOT IN ('run-5', 'run-6'))
		+ (SELECT count(*) FROM event_ids WHERE run_id NOT IN ('run-5', 'run-6'))`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d snapshot and event id rows of removed runs left (%v)", left, err)
	}
	if res, err := r.Pass(ctx); err != nil || res.Archived+res.Removed != 0 {
		t.Fatalf("second pass: %+v %v", res, err)
	}
	_, err = h.store.Pool().Exec(ctx, "DELETE FROM run_events WHERE run_id = 'run-5'")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("the runtime role's DELETE: %v, want refused (42501)", err)
	}
}

// TestRetention_KillDashNinePostgres is TestRetention_KillDashNine on the
// PostgreSQL log: a process is SIGKILLed in the middle of a pass, at each
// of the same points, and a new process finds no run lost, then finishes
// the job.
func TestRetention_KillDashNinePostgres(t *testing.T) {
	if os.Getenv(killDirEnv) != "" {
		t.Skip("the child's own run")
	}
	ctx := context.Background()
	for _, at := range []string{"segment-written", "archive-confirmed", "one-run-removed"} {
		t.Run(at, func(t *testing.T) {
			h := newPGHot(t, 6, 2)
			cmd := exec.Command(os.Args[0], "-test.run=^TestRetention_KillChildPostgres$", "-test.v")
			cmd.Env = append(os.Environ(), killDirEnv+"="+h.dir, killAtEnv+"="+at, killRuntimeEnv+"="+h.runtimeURL, killRetentionEnv+"="+h.retentionURL)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child: %v, want killed by SIGKILL\n%s", err, out)
			}
			h.requireSafe(false)
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
			want := map[string][3]int{"segment-written": {0, 1, 0}, "archive-confirmed": {1, 0, 0}, "one-run-removed": {1, 0, 1}}[at]
			if got := [3]int{int(mid.Manifests), len(mid.Orphans), removed}; got != want {
				t.Fatalf("after the kill: %d manifests, %d orphans, %d runs removed; want %v", got[0], got[1], got[2], want)
			}
			time.Sleep(holeGrace + 200*time.Millisecond) // the removed run's records are older than the grace
			if _, err := h.retention(h.archive(nil), h.remover(), retention.Options{}).Pass(ctx); err != nil {
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

// TestRetention_KillChildPostgres is the child of
// TestRetention_KillDashNinePostgres: a pass that SIGKILLs its own process
// at RETENTION_KILL_AT.
func TestRetention_KillChildPostgres(t *testing.T) {
	dir, at := os.Getenv(killDirEnv), os.Getenv(killAtEnv)
	if dir == "" || os.Getenv(killRuntimeEnv) == "" {
		t.Skip("run by TestRetention_KillDashNinePostgres")
	}
	die := func() error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
		return errors.New("not killed")
	}
	h := openPGHot(t, os.Getenv(killRuntimeEnv), os.Getenv(killRetentionEnv), dir)
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
	_, err := h.retention(a, rm, retention.Options{BatchRuns: 3}).Pass(context.Background())
	t.Fatalf("the pass ended without being killed: %v", err)
}
