package proctest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopWithin bounds the wait for a stopped process's threads to stop.
const stopWithin = 10 * time.Second

// Freeze stops the processes pids (SIGSTOP: a hung host, whose kernel
// still accepts connections while nothing answers) and returns once every
// thread of each has stopped. kill returns before the kernel has stopped
// a process's threads, and a thread still running in that window answers
// a request sent after Freeze. The returned thaw (SIGCONT; also run when
// the test ends) lets them go on. A process that has exited is left
// alone: it answers nothing either.
func Freeze(tb testing.TB, pids ...int) (thaw func()) {
	tb.Helper()
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		})
	}
	tb.Cleanup(thaw)
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && err != syscall.ESRCH {
			tb.Fatalf("freeze process %d: %v", pid, err)
		}
	}
	deadline := time.Now().Add(stopWithin)
	for _, pid := range pids {
		for {
			running, err := runningThread(pid)
			if err != nil {
				tb.Fatalf("freeze process %d: %v", pid, err)
			}
			if running == "" {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("freeze process %d: thread %s still runs %s after SIGSTOP", pid, running, stopWithin)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return thaw
}

// runningThread returns a thread of pid that has not stopped ("" when
// every one has stopped or exited, or the process has).
func runningThread(pid int) (string, error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil {
		return "", err
	}
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return "", fmt.Errorf("%s: unexpected %q", p, b)
		}
		switch b[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			return filepath.Base(filepath.Dir(p)), nil
		}
	}
	return "", nil
}
