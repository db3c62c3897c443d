package natsstore_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// envLockChild makes the test binary a child that holds the data dir lock
// of TestLockDataDir_UnlinkedLockFile: the dir is its value.
const envLockChild = "NATSSTORE_LOCK_CHILD_DIR"

// TestLockDataDir_UnlinkedLockFile: another process holds the data dir;
// deleting (or replacing) <data-dir>/sidecar.lock does not let this one
// take the dir too. The lock is on the directory itself.
func TestLockDataDir_UnlinkedLockFile(t *testing.T) {
	if dir := os.Getenv(envLockChild); dir != "" {
		unlock, err := natsstore.LockDataDir(dir)
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		fmt.Println("LOCKED")
		_, _ = io.Copy(io.Discard, os.Stdin) // hold until the parent closes stdin
		_ = unlock()
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockDataDir_UnlinkedLockFile$")
	cmd.Env = append(os.Environ(), envLockChild+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "LOCKED\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	for _, tamper := range []string{"unlink", "replace"} {
		path := filepath.Join(dir, natsstore.LockFile)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if tamper == "replace" {
			if err := os.WriteFile(path, []byte("pid=1\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		unlock, err := natsstore.LockDataDir(dir)
		if !errors.Is(err, natsstore.ErrDataDirLocked) {
			if err == nil {
				_ = unlock()
			}
			t.Fatalf("lock file %s, then a second LockDataDir in another process: %v, want ErrDataDirLocked", tamper, err)
		}
	}
	// Once the holder is gone, the dir can be locked.
	_ = stdin.Close()
	_ = cmd.Wait()
	unlock, err := natsstore.LockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after the holder exited: %v", err)
	}
	_ = unlock()
}
