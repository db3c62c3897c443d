package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_KillLeavesNoOrphanCommand: kill -9 of serve while a command step
// runs a background process in its group (the leader dies of the
// parent-death signal, the child does not). Run as a child of the test,
// nothing else kills that group, as on a bare host. By the time the
// restart has recorded the try ended (RunStepTryEnded, workerRestarted),
// the old command must be gone: its heartbeat stops and its pid is free.
func TestE2E_KillLeavesNoOrphanCommand(t *testing.T) {
	t.Parallel() // its own serve and data dir
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pids")
	// The inner sh appends its pid, then writes a heartbeat of its own
	// every 100 ms (a later try of the step writes another file), to a
	// temporary file renamed over it, so that the kill never leaves it
	// empty. It
	// ignores SIGTERM, so that its end takes the kill grace: the try must
	// not be recorded ended during it.
	inner := `trap "" TERM; ` + "echo $$ >> " + pidFile + "; while :; do date +%s%N > " + dir + "/.beat.$$ && mv " + dir + "/.beat.$$ " + dir + "/beat.$$; sleep 0.1; done"
	pl := &plan.Plan{PlanID: uniq("e2e-orphan"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "beat", Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", `sh -c '` + inner + `' & wait`}}},
	}}
	started := submit(t, p, pl, "req-1")
	var pid int
	sidecartest.WaitFor(t, "the step's background process to write its pid", 60*time.Second, func() bool {
		b, err := os.ReadFile(pidFile)
		first, _, ok := strings.Cut(string(b), "\n")
		if err != nil || !ok {
			return false
		}
		pid, err = strconv.Atoi(first)
		return err == nil
	})
	beat := filepath.Join(dir, "beat."+strconv.Itoa(pid))
	t.Cleanup(func() { killGroupOf(pid) }) // whatever the outcome
	sidecartest.WaitFor(t, "the heartbeat", 30*time.Second, func() bool { _, err := os.Stat(beat); return err == nil })

	p.stop(syscall.SIGKILL)
	if !processAlive(pid) {
		t.Fatalf("the step's background process %d died with serve: the test shows nothing", pid)
	}
	p2 := startServe(t, dataDir, addr)
	var ended statestore.RunEventRecord
	sidecartest.WaitFor(t, "the restart to record the try ended (workerRestarted)", 2*time.Minute, func() bool {
		evs := allEvents(t, p2, started.RunID)
		i := eventIndex(evs, statestore.RunStepTryEnded, "", 0)
		if i >= 0 && strings.Contains(string(evs[i].Payload), `"`+statestore.TryEndedWorkerRestarted+`"`) {
			ended = evs[i]
			return true
		}
		return false
	})
	if processAlive(pid) {
		t.Fatalf("the restart recorded the try ended (workerRestarted), but the old command (pid %d) is still running", pid)
	}
	// The API answers once serve is up, so also compare times: the old
	// command's last heartbeat (before it died) precedes the event.
	before, _ := os.ReadFile(beat)
	last, err := strconv.ParseInt(strings.TrimSpace(string(before)), 10, 64)
	if err != nil {
		t.Fatalf("heartbeat %q: %v", before, err)
	}
	at, err := time.Parse(time.RFC3339Nano, ended.PersistedAt)
	if err != nil {
		t.Fatal(err)
	}
	if lastBeat := time.Unix(0, last); !lastBeat.Before(at) {
		t.Fatalf("the old command still ran %s after the restart recorded its try ended (last heartbeat %s, RunStepTryEnded persisted %s)",
			lastBeat.Sub(at), lastBeat.UTC().Format(time.RFC3339Nano), ended.PersistedAt)
	}
	time.Sleep(time.Second) // ten heartbeats, were it alive
	if after, _ := os.ReadFile(beat); !bytes.Equal(before, after) {
		t.Fatalf("the old command's heartbeat goes on after the restart recorded the try ended: %q then %q", before, after)
	}
	validLog(t, allEvents(t, p2, started.RunID))
	if _, err := p2.client.Cancel(t.Context(), started.RunID, "test done"); err != nil {
		t.Fatal(err)
	}
}

// processAlive reports whether pid is a live process (not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// killGroupOf kills the process group of pid, if pid still runs.
func killGroupOf(pid int) {
	if pid <= 0 || !processAlive(pid) {
		return
	}
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid > 1 && pgid != syscall.Getpgrp() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}
