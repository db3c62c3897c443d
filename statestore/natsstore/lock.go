package natsstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// LockFile is the name of the lock file LockDataDir keeps in a data dir.
const LockFile = "sidecar.lock"

// ErrDataDirLocked is returned by LockDataDir (and StartEmbedded) when
// another process holds the data dir. The error's text names that process.
var ErrDataDirLocked = errors.New("DATA_DIR_LOCKED: the data dir is locked by another process")

// ErrDataDirUnusable is returned by LockDataDir when the data dir cannot be
// created or written (read-only file system, permissions, no space).
var ErrDataDirUnusable = errors.New("DATA_DIR_UNUSABLE: the data dir is not usable")

// LockDataDir creates dir if needed and takes an exclusive lock (flock) on
// the directory itself, then on dir/sidecar.lock, into which it writes this
// process's pid, host and start time. Two servers on one data dir corrupt
// each other's store files, so a second LockDataDir on the same dir, from
// any process, fails at once with ErrDataDirLocked, naming the holder.
// The lock is on the directory's inode: deleting or replacing the lock
// file does not release it. The lock file's own lock keeps a sidecar of an
// older release, which locked only the file, off the dir too. The locks
// are released by the returned func, or by the kernel when the process dies
// (kill -9 leaves no stale lock).
func LockDataDir(dir string) (unlock func() error, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %s: %v; make it writable by this user or choose another --data-dir", ErrDataDirUnusable, dir, err)
	}
	path := filepath.Join(dir, LockFile)
	d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v; make it a directory this user can read or choose another --data-dir", ErrDataDirUnusable, err)
	}
	if err := flock(d, dir, path); err != nil {
		_ = d.Close()
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("%w: %v; make it writable by this user or choose another --data-dir", ErrDataDirUnusable, err)
	}
	if err := flock(f, dir, path); err != nil {
		_, _ = f.Close(), d.Close()
		return nil, err
	}
	host, _ := os.Hostname()
	info := fmt.Sprintf("pid=%d host=%s since=%s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	if err := writeLockInfo(f, info); err != nil {
		_, _ = f.Close(), d.Close()
		return nil, fmt.Errorf("%w: write %s: %v; make it writable by this user or choose another --data-dir", ErrDataDirUnusable, path, err)
	}
	// Closing the descriptors releases the locks.
	return func() error { return errors.Join(f.Close(), d.Close()) }, nil
}

// flock takes an exclusive lock on f (the data dir or its lock file)
// without waiting; path is the lock file, which names the holder.
func flock(f *os.File, dir, path string) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		holder, _ := os.ReadFile(path)
		return fmt.Errorf("%w: %s is held by %s; stop that process or give this one another --data-dir",
			ErrDataDirLocked, dir, describeHolder(string(holder)))
	}
	return fmt.Errorf("%w: lock %s: %v", ErrDataDirUnusable, f.Name(), err)
}

// DefaultMinFreeBytes is the free space below which a data dir is not
// usable: the event stream fsyncs every append, and a store that runs out
// of space mid-write fails appends, so the sidecar stops short of it.
const DefaultMinFreeBytes = 32 << 20

// CheckFreeSpace returns an error matching ErrDataDirUnusable when the file
// system of dir has less than min bytes available to this user.
func CheckFreeSpace(dir string, min uint64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("%w: statfs %s: %v", ErrDataDirUnusable, dir, err)
	}
	free := st.Bavail * uint64(st.Bsize)
	if free < min {
		return fmt.Errorf("%w: %s has %d KiB free, below the %d KiB the store needs to append; free space or move --data-dir",
			ErrDataDirUnusable, dir, free>>10, min>>10)
	}
	return nil
}

func writeLockInfo(f *os.File, info string) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(info), 0); err != nil {
		return err
	}
	return f.Sync()
}

func describeHolder(info string) string {
	info = strings.TrimSpace(info)
	if info == "" {
		return "another process"
	}
	return "another process (" + info + ")"
}
