package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// hideFromSameUser makes serve not dumpable (prctl PR_SET_DUMPABLE 0).
// Command steps run as serve's user; without this, any of them can read
// /proc/<serve pid>/environ (serve's credentials: PGPASSWORD, cloud keys),
// its memory (/proc/<pid>/mem) or attach a debugger. Not dumpable, those
// files belong to root and the kernel refuses same-user processes without
// CAP_SYS_PTRACE. Steps are unaffected: execve makes each program dumpable
// again. serve also writes no core dump.
func hideFromSameUser() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_DUMPABLE 0 (keep command steps from reading serve's environment): %w; run serve on Linux", err)
	}
	return nil
}
