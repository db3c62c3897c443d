package proctest_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/proctest"
)

// envStarterDir makes this test binary a test process that starts a child
// through the harness, writes the child's pid to a file in its value, and
// waits to be killed (TestHelperStarter).
const envStarterDir = "PROCTEST_STARTER_DIR"

// goneWithin is a safety net for a loaded machine: the kernel kills the
// child as the parent dies; the wait is for the signal to land.
const goneWithin = 2 * time.Minute

// TestHelperStarter is the test process of TestStart_ChildDiesWithTheTest:
// it starts a server through proctest.Start, writes the server's pid to
// $PROCTEST_STARTER_DIR/pid and blocks until it is killed.
func TestHelperStarter(t *testing.T) {
	dir := os.Getenv(envStarterDir)
	if dir == "" {
		t.Skip("the test process of TestStart_ChildDiesWithTheTest")
	}
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$")
	cmd.Env = append(os.Environ(), envListen+"="+addr)
	p := proctest.Start(t, cmd, proctest.Options{}, addr)
	writePid(t, dir, "pid", p.Cmd.Process.Pid)
	select {}
}

// TestHelperGroupStarter is the test process of
// TestStartTiedGroup_GroupDiesWithTheTest: through proctest.StartTiedGroup
// it starts a shell that starts a sleep of its own (as the Python SDK
// starts its workers), writes the shell's leader pid to
// $PROCTEST_STARTER_DIR/leader (the sleep writes its own to grandchild)
// and blocks until it is killed.
func TestHelperGroupStarter(t *testing.T) {
	dir := os.Getenv(envStarterDir)
	if dir == "" {
		t.Skip("the test process of TestStartTiedGroup_GroupDiesWithTheTest")
	}
	cmd := exec.Command("sh", "-c", `sleep 600 & echo $! > "$0/grandchild.tmp" && mv "$0/grandchild.tmp" "$0/grandchild"; wait`, dir)
	if err := proctest.StartTiedGroup(cmd); err != nil {
		t.Fatal(err)
	}
	writePid(t, dir, "leader", cmd.Process.Pid)
	select {}
}

func writePid(t *testing.T, dir, name string, pid int) {
	t.Helper()
	tmp := filepath.Join(dir, name+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// TestStart_ChildDiesWithTheTest SIGKILLs a test process while the server
// it started through proctest.Start runs, and sees the server end too: a
// killed test run (a CI timeout, kill -9) leaves no server behind.
func TestStart_ChildDiesWithTheTest(t *testing.T) {
	pids := runStarterAndKill(t, "^TestHelperStarter$", "pid")
	waitGone(t, "the server started through proctest.Start", pids[0])
}

// TestStartTiedGroup_GroupDiesWithTheTest SIGKILLs a test process while
// the process group it started through StartTiedGroup runs, and sees the
// group's leader and the child the command started end too.
func TestStartTiedGroup_GroupDiesWithTheTest(t *testing.T) {
	pids := runStarterAndKill(t, "^TestHelperGroupStarter$", "leader", "grandchild")
	waitGone(t, "the group leader started through proctest.StartTiedGroup", pids[0])
	waitGone(t, "the child of the command started through proctest.StartTiedGroup", pids[1])
}

// TestStartTiedGroup_ExitStatus: the command's exit status is the
// process's, as without the group's reaper.
func TestStartTiedGroup_ExitStatus(t *testing.T) {
	cmd := exec.Command("sh", "-c", "exit 7")
	if err := proctest.StartTiedGroup(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 7 {
		t.Fatalf("exit %v (%v), want 7", cmd.ProcessState.ExitCode(), err)
	}
}

// runStarterAndKill runs this test binary as a test process (test names
// run), waits until it wrote a pid file for every name, SIGKILLs it, and
// returns the pids.
func runStarterAndKill(t *testing.T, run string, names ...string) []int {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v")
	cmd.Env = append(os.Environ(), envStarterDir+"="+dir)
	out, err := os.Create(filepath.Join(dir, "starter.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	pids := make([]int, len(names))
	deadline := time.Now().Add(goneWithin)
	for i, name := range names {
		for {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err == nil {
				pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
				if err != nil {
					t.Fatal(err)
				}
				pids[i] = pid
				t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // this test's own grandchild, if the harness failed
				break
			}
			select {
			case <-exited:
				b, _ := os.ReadFile(out.Name())
				t.Fatalf("the test process exited before it wrote %s:\n%s", name, b)
			default:
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(out.Name())
				t.Fatalf("no %s from the test process after %s:\n%s", name, goneWithin, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	return pids
}

// waitGone waits until process pid has ended (gone, or a zombie nobody
// reaped yet) and fails the test if it still runs after goneWithin.
func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(goneWithin)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs %s after the test process that started it was SIGKILLed", what, pid, goneWithin)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid is a process that has not exited.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) == 0 || fields[0] != "Z"
}

// TestCombinedOutput: the command's output and exit status, as
// exec.Cmd.CombinedOutput gives them.
func TestCombinedOutput(t *testing.T) {
	out, err := proctest.CombinedOutput(exec.Command("sh", "-c", "echo out; echo err >&2; exit 3"))
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || string(out) != "out\nerr\n" {
		t.Fatalf("output %q, error %v; want \"out\\nerr\\n\" and exit 3", out, err)
	}
}
