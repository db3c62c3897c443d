package proctest

import (
	"bytes"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// The processes a test starts end with the test process, however it ends
// (a CI timeout's SIGKILL, kill -9, a panic): Linux sends a process's
// parent-death signal (SysProcAttr.Pdeathsig) when the OS thread that
// forked it exits, not when the process does. Go ends a thread when a
// goroutine locked to it returns, so the processes are started from one
// goroutine locked to its thread that never returns: the thread lives as
// long as the test process.
var (
	spawnOnce sync.Once
	spawns    chan func()
)

// onSpawnThread runs f on the long-lived spawning thread and waits for it.
func onSpawnThread(f func()) {
	spawnOnce.Do(func() {
		spawns = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive every child
			for f := range spawns {
				f()
			}
		}()
	})
	done := make(chan struct{})
	spawns <- func() {
		defer close(done)
		f()
	}
	<-done
}

// StartTied starts cmd (as cmd.Start) so that the kernel SIGKILLs it when
// the test process dies. It keeps the rest of cmd.SysProcAttr. Only cmd's
// own process is tied: for a process that starts children of its own, use
// StartTiedGroup.
func StartTied(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var err error
	onSpawnThread(func() { err = cmd.Start() })
	return err
}

// groupReaper runs its arguments as a child and, on SIGTERM (its
// parent-death signal), SIGKILLs its whole process group: the command and
// every process the command started in the group. Otherwise it exits with
// the command's status.
const groupReaper = `trap 'kill -s KILL 0' TERM; "$@" & wait $!`

// StartTiedGroup starts cmd in a process group of its own under a small
// sh that SIGKILLs the whole group when the test process dies: for a
// process that starts children of its own (the Python SDK runs each worker
// in a child process), which a parent-death signal of its own would not
// reach. cmd.Process is the sh, the leader of the group: signal -Pid to
// reach the group (a SIGTERM to the sh kills the group too). cmd's stdin
// is not the command's (a command run in the background reads /dev/null).
func StartTiedGroup(cmd *exec.Cmd) error {
	if cmd.Err != nil {
		return cmd.Err
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return err
	}
	cmd.Args = append([]string{"sh", "-c", groupReaper, "sh", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = sh
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	onSpawnThread(func() { err = cmd.Start() })
	return err
}

// CombinedOutput is cmd.CombinedOutput with cmd started by StartTied: for
// a command a test expects to exit by itself (a refusal), which must not
// outlive the test process if it does not.
func CombinedOutput(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := StartTied(cmd); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return out.Bytes(), err
}
