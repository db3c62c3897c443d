package exec

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// group is a process group the test started, standing for a command a
// dead sidecar left running.
type group struct {
	leader *osexec.Cmd
	pgid   int
	child  int // a background process of the group
	reaped chan struct{}
}

// startGroup runs script (which must write the pid of a background process
// to $CHILD and keep running) as the leader of a new process group.
func startGroup(t *testing.T, script string) *group {
	t.Helper()
	f := filepath.Join(t.TempDir(), "child")
	c := osexec.Command("sh", "-c", script)
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "CHILD=" + f}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	g := &group{leader: c, pgid: c.Process.Pid, reaped: make(chan struct{})}
	go func() { _ = c.Wait(); close(g.reaped) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		if g.child > 0 {
			_ = syscall.Kill(g.child, syscall.SIGKILL)
		}
		<-g.reaped
	})
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(f)
		if first, _, ok := strings.Cut(string(b), "\n"); err == nil && ok {
			if g.child, err = strconv.Atoi(first); err != nil {
				t.Fatal(err)
			}
			return g
		}
		if time.Now().After(deadline) {
			t.Fatal("the group's background process did not write its pid")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killLeader kills the leader alone (as the parent-death signal does) and
// reaps it: the group lives on in its background process.
func (g *group) killLeader(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(g.pgid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-g.reaped
}

func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && !st.dead()
}

// recordGroup writes g's record into dir as a sidecar does, then edits it
// with edit (nil: as written).
func recordGroup(t *testing.T, dir string, g *group, edit func(r *commandRecord)) {
	t.Helper()
	d := &commandDir{dir: dir, log: zaptest.NewLogger(t)}
	if err := d.open(context.Background()); err != nil {
		t.Fatal(err)
	}
	x := taskworkers.Execution{RunID: t.Name(), StepID: "s", LogicalAttemptID: 2, EngineAttemptID: 1}
	if err := d.record(g.pgid, x, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := d.close(); err != nil {
		t.Fatal(err)
	}
	if edit == nil {
		return
	}
	b, err := os.ReadFile(d.path(g.pgid))
	if err != nil {
		t.Fatal(err)
	}
	var r commandRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	edit(&r)
	if b, err = json.Marshal(&r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.path(g.pgid), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func openRegistry(t *testing.T, dir string) *Registry {
	t.Helper()
	r := New(Options{CommandDir: dir, KillGrace: 200 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err := r.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

func noRecords(t *testing.T, dir string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(left) != 0 {
		t.Errorf("records left in %s: %v %v", dir, left, err)
	}
}

const background = `sh -c 'echo $$ > "$CHILD"; exec sleep 600' & `

func TestRegistry_OpenEndsLeftoverCommands(t *testing.T) {
	t.Run("LeaderAlive", func(t *testing.T) {
		dir := t.TempDir()
		g := startGroup(t, background+"wait")
		recordGroup(t, dir, g, nil)
		openRegistry(t, dir)
		if alive(g.pgid) || alive(g.child) {
			t.Errorf("after Open: leader alive %v, background process alive %v; want both ended", alive(g.pgid), alive(g.child))
		}
		noRecords(t, dir)
	})
	t.Run("LeaderGone", func(t *testing.T) {
		dir := t.TempDir()
		g := startGroup(t, background+"wait")
		recordGroup(t, dir, g, nil)
		g.killLeader(t)
		openRegistry(t, dir)
		if alive(g.child) {
			t.Errorf("the background process %d of the leaderless group %d still runs after Open", g.child, g.pgid)
		}
		noRecords(t, dir)
	})
	t.Run("IgnoresSIGTERM", func(t *testing.T) {
		dir := t.TempDir()
		g := startGroup(t, `trap "" TERM; `+background+"wait")
		recordGroup(t, dir, g, nil)
		g.killLeader(t)
		openRegistry(t, dir)
		if alive(g.child) {
			t.Errorf("the background process %d ignores SIGTERM and still runs after Open (want SIGKILL after the grace)", g.child)
		}
	})
}

// TestRegistry_OpenSparesOtherProcesses: a record whose group is not the
// recorded one any more (a reused pid, a reboot) kills nothing.
func TestRegistry_OpenSparesOtherProcesses(t *testing.T) {
	for _, tc := range []struct {
		name       string
		leaderGone bool
		edit       func(r *commandRecord)
	}{
		// The pid is a process that started at another tick.
		{"LeaderStartedElsewhen", false, func(r *commandRecord) { r.StartTicks-- }},
		// The group's processes started before the recorded leader.
		{"MembersOlderThanLeader", true, func(r *commandRecord) { r.StartTicks += 1 << 20 }},
		{"EarlierBoot", false, func(r *commandRecord) { r.BootID = "00000000-0000-4000-8000-000000000000" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			g := startGroup(t, background+"wait")
			recordGroup(t, dir, g, tc.edit)
			if tc.leaderGone {
				g.killLeader(t)
			}
			openRegistry(t, dir)
			if !alive(g.child) || (!tc.leaderGone && !alive(g.pgid)) {
				t.Errorf("Open killed a process group that is not the recorded one")
			}
			noRecords(t, dir)
		})
	}
}

func TestCommand_RecordsItsGroup(t *testing.T) {
	dir, out := t.TempDir(), t.TempDir()
	r := openRegistry(t, dir)
	x := taskworkers.Execution{RunID: t.Name(), StepID: "copy", LogicalAttemptID: 3, EngineAttemptID: 2,
		Spec: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c",
			// The record is written right after the spawn: wait for it.
			`i=0; while [ ! -e "$D"/$$.json ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; cp "$D"/$$.json "$O"/; echo $$ > "$O"/pid`},
			Env: map[string]string{"D": dir, "O": out}}}
	res, err := r.Execute(context.Background(), x)
	if err != nil || res.Err != nil {
		t.Fatalf("execute: %v %+v", err, res.Err)
	}
	pid, _ := os.ReadFile(filepath.Join(out, "pid"))
	b, err := os.ReadFile(filepath.Join(out, strings.TrimSpace(string(pid))+recordSuffix))
	if err != nil {
		t.Fatalf("no record of the running command: %v", err)
	}
	var rec commandRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if strconv.Itoa(rec.PGID) != strings.TrimSpace(string(pid)) || rec.RunID != x.RunID || rec.StepID != "copy" ||
		rec.LogicalAttemptID != 3 || rec.EngineAttemptID != 2 || rec.StartTicks == 0 || rec.BootID == "" || rec.Sidecar != os.Getpid() {
		t.Errorf("record %+v", rec)
	}
	noRecords(t, dir)
}

// TestCommand_UnrecordedDoesNotRun: with a CommandDir that could not be
// used (here: never opened) a command is killed at once and the step
// fails, retryable.
func TestCommand_UnrecordedDoesNotRun(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	r := New(Options{CommandDir: t.TempDir(), Logger: zaptest.NewLogger(t)})
	res, err := r.Execute(context.Background(), taskworkers.Execution{RunID: t.Name(), StepID: "s", LogicalAttemptID: 1, EngineAttemptID: 1,
		Spec: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", "sleep 1; touch " + marker}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Err == nil || res.Err.Code != CodeCommandStartFailed || !res.Err.Retryable {
		t.Fatalf("got %+v, want %s retryable", res.Err, CodeCommandStartFailed)
	}
	time.Sleep(1500 * time.Millisecond) // the command would have touched the marker by now
	if _, err := os.Stat(marker); err == nil {
		t.Error("the unrecorded command ran to its end")
	}
}

func TestRegistry_OpenLocked(t *testing.T) {
	dir := t.TempDir()
	first := New(Options{CommandDir: dir})
	if err := first.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := New(Options{CommandDir: dir})
	if err := second.Open(context.Background()); !errors.Is(err, ErrCommandDirLocked) {
		t.Fatalf("second Open: got %v want %v", err, ErrCommandDirLocked)
	}
	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := second.Open(context.Background()); err != nil {
		t.Fatalf("Open after the first Close: %v", err)
	}
	_ = second.Close(context.Background())
}

func TestParseStat(t *testing.T) {
	line := "42 (a) b (c)) S 1 40 40 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"
	st, err := parseStat(42, []byte(line))
	if err != nil || st.state != 'S' || st.pgrp != 40 || st.start != 123456 {
		t.Fatalf("got %+v, %v", st, err)
	}
	for _, bad := range []string{"", "42 no paren", "42 (a) S 1 x", "42 (a) S 1 40"} {
		if _, err := parseStat(42, []byte(bad)); err == nil {
			t.Errorf("parseStat(%q): want an error", bad)
		}
	}
}
