package main

import (
	"fmt"
	"syscall"
)

// Descriptors serve keeps out of the connection bound's reach: for the
// store (the embedded NATS server's block files and connections, or the
// PostgreSQL pool), the workers' connections to Conductor, command
// steps' pipes, artifacts, logs and the process's own files. 1,024 is
// the whole default limit of many systems, many times what these use at
// once here (serve idles at about 20).
const descriptorReserve = 1024

// connListeners is the number of listeners the bound is shared by: the
// API, the metrics listener and the task proxy each get up to a third of
// what is left after the reserve, so that all of them full at once still
// leave the reserve.
const connListeners = 3

// descriptorLimit is the process's limit on open descriptors
// (RLIMIT_NOFILE, soft; Go raises it to the hard limit at start).
func descriptorLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("read the descriptor limit (RLIMIT_NOFILE): %w", err)
	}
	return lim.Cur, nil
}

// reserveOf is the reserve under a descriptor limit of nofile: the
// reserve, or half of a smaller limit.
func reserveOf(nofile uint64) uint64 { return min(descriptorReserve, nofile/2) }

// defaultMaxConnections is the bound of each listener under a
// descriptor limit of nofile.
func defaultMaxConnections(nofile uint64) int {
	return int(min((nofile-reserveOf(nofile))/connListeners, 1<<30))
}

// maxConnections is the bound --max-connections asks for (0: derived
// from nofile), or an error naming the fix when it is negative or more
// than a listener's share (it may lower the bound, not raise it).
func maxConnections(flag int, nofile uint64) (int, error) {
	share := defaultMaxConnections(nofile)
	switch {
	case flag < 0:
		return 0, fmt.Errorf("--max-connections %d: give a positive number, or 0 to derive it from the descriptor limit", flag)
	case flag == 0:
		return share, nil
	case flag > share:
		return 0, fmt.Errorf("--max-connections %d is more than a listener's share of this process's descriptor limit of %d (RLIMIT_NOFILE): give at most %d, or raise the limit (LimitNOFILE=, ulimit -n)",
			flag, nofile, share)
	}
	return flag, nil
}
