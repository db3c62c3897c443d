package exec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// Command records: what a restart needs to end the commands of a process
// that died.
//
// The command executor starts each command in its own process group and
// kills the group when the step ends. If the sidecar dies (kill -9, OOM),
// the leader gets SIGKILL (the parent-death signal), but what it started
// in its group lives on, unsupervised, while the restart records the try
// ended (RunStepTryEnded, workerRestarted) and hands the task back: a
// later try would run beside it. Under systemd (KillMode=control-group or
// mixed) or in a container the supervisor kills them; on a bare host
// nothing does. So, with Options.CommandDir set, every running command has
// a record there (<pgid>.json: the process group id, the leader's start
// time and the boot id, which identify the group, and the run, step and
// attempts), written right after the spawn and removed once the group is
// dead. Registry.Open, before the worker records any try ended, kills
// every group a dead process left recorded (SIGTERM, SIGKILL after
// KillGrace) once it has checked that the group is still the recorded one.

// recordSuffix ends the name of a command record.
const recordSuffix = ".json"

// leftoverKillWait bounds the wait for a leftover group to vanish after
// SIGKILL (a process in uninterruptible sleep dies only when its I/O
// returns).
const leftoverKillWait = time.Minute

// commandRecord is the file kept for one running command.
type commandRecord struct {
	// PGID is the process group id: the leader's pid.
	PGID int `json:"pgid"`
	// StartTicks is the leader's start time, in clock ticks after boot
	// (field 22 of /proc/<pid>/stat).
	StartTicks uint64 `json:"startTicks"`
	// BootID is /proc/sys/kernel/random/boot_id when the command started:
	// after a reboot nothing of it runs, and pids and ticks restart.
	BootID           string `json:"bootId"`
	RunID            string `json:"runId"`
	StepID           string `json:"stepId"`
	LogicalAttemptID int64  `json:"logicalAttemptId"`
	EngineAttemptID  int64  `json:"engineAttemptId"`
	StartedAt        string `json:"startedAt"`
	// Sidecar is the pid of the sidecar that ran the command.
	Sidecar int `json:"sidecarPid"`
}

func (r *commandRecord) fields() []zap.Field {
	return []zap.Field{zap.Int("pgid", r.PGID), zap.String("runId", r.RunID), zap.String("stepId", r.StepID),
		zap.Int64("logicalAttemptId", r.LogicalAttemptID), zap.Int64("engineAttemptId", r.EngineAttemptID),
		zap.String("startedAt", r.StartedAt), zap.Int("sidecarPid", r.Sidecar)}
}

// commandDir keeps the command records of one process in dir.
type commandDir struct {
	dir      string
	grace    time.Duration
	killWait time.Duration
	log      *zap.Logger

	mu     sync.Mutex
	lock   *os.File // the flock on dir; nil until open
	bootID string
}

// open locks the directory (one process per directory), then kills the
// groups its records name that still run. It fails when the directory is
// unusable or locked, or a leftover group survives SIGKILL.
func (d *commandDir) open(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lock != nil {
		return nil
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return fmt.Errorf("%w: %v; make it writable by this user or choose another --data-dir", ErrCommandDirUnusable, err)
	}
	f, err := os.OpenFile(d.dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("%w: %v; make it a directory this user can read or choose another --data-dir", ErrCommandDirUnusable, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s; stop the other sidecar or give this one another --data-dir", ErrCommandDirLocked, d.dir)
		}
		return fmt.Errorf("%w: lock %s: %v", ErrCommandDirUnusable, d.dir, err)
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("%w: read the boot id: %v (command records need Linux's /proc)", ErrCommandDirUnusable, err)
	}
	d.bootID = strings.TrimSpace(string(boot))
	if err := d.sweep(ctx); err != nil {
		_ = f.Close()
		return err
	}
	d.lock = f
	return nil
}

// close releases the directory's lock.
func (d *commandDir) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lock == nil {
		return nil
	}
	err := d.lock.Close()
	d.lock = nil
	return err
}

// sweep ends every recorded group that is still the recorded one, and
// removes the records.
func (d *commandDir) sweep(ctx context.Context) error {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCommandDirUnusable, err)
	}
	for _, e := range entries {
		path := filepath.Join(d.dir, e.Name())
		if !strings.HasSuffix(e.Name(), recordSuffix) {
			// A record half written when the process died (the spawn's
			// leader died of the parent-death signal with it).
			if strings.HasSuffix(e.Name(), recordSuffix+".tmp") {
				_ = os.Remove(path)
			}
			continue
		}
		var r commandRecord
		b, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || r.PGID <= 1 {
			d.log.Warn("ignoring an unreadable command record", zap.String("file", path), zap.Error(err))
			_ = os.Remove(path)
			continue
		}
		if err := d.end(ctx, &r); err != nil {
			return err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %v", ErrCommandDirUnusable, err)
		}
	}
	return nil
}

// end kills the group of r if it is still r's: SIGTERM, SIGKILL after the
// grace, then waits for it to be gone.
func (d *commandDir) end(ctx context.Context, r *commandRecord) error {
	log := d.log.With(r.fields()...)
	if r.BootID != d.bootID {
		log.Info("command record of an earlier boot; nothing of it runs")
		return nil
	}
	if r.PGID == syscall.Getpgrp() {
		log.Warn("not killing the recorded process group: it is this sidecar's own")
		return nil
	}
	switch ours, why := identify(r); {
	case !ours && why == "":
		log.Debug("the recorded command is gone")
		return nil
	case !ours:
		log.Warn("not killing the recorded process group: "+why, zap.Uint64("recordedStartTicks", r.StartTicks))
		return nil
	}
	log.Warn("a command of a previous process still runs; sending SIGTERM to its process group", zap.Duration("killGrace", d.grace))
	signalRecorded(r, syscall.SIGTERM)
	if d.waitGone(ctx, r, d.grace) {
		log.Info("the previous process's command ended after SIGTERM")
		return nil
	}
	log.Warn("the previous process's command still runs after the kill grace; sending SIGKILL to its process group")
	signalRecorded(r, syscall.SIGKILL)
	if d.waitGone(ctx, r, d.killWait) {
		log.Info("the previous process's command ended after SIGKILL")
		return nil
	}
	return fmt.Errorf("%w: process group %d (run %q, step %q, logical attempt %d) survives SIGKILL; end it (kill -KILL -- -%d) and start again",
		ErrLeftoverCommand, r.PGID, r.RunID, r.StepID, r.LogicalAttemptID, r.PGID)
}

// identify reports whether the group r names is still r's. When it is not,
// why says why ("" when no process of the group is left).
//
// A pid is not reused while it is some live process's group id, so a
// group with members is the recorded one unless all of it ended and the
// pid came round again as a new group's id (Linux hands pids out in
// increasing order, so that takes pid_max new processes). The leader's
// start time tells: when the leader lives (it is the pgid's process) it
// must have started at the recorded tick; when it is gone, every member
// must have started at or after it.
func identify(r *commandRecord) (bool, string) {
	leader, err := readStat(r.PGID)
	if err == nil {
		if leader.start != r.StartTicks {
			return false, fmt.Sprintf("pid %d is another process now (started at tick %d)", r.PGID, leader.start)
		}
		return true, ""
	}
	members := groupMembers(r.PGID)
	if len(members) == 0 {
		return false, ""
	}
	for _, m := range members {
		if m.start < r.StartTicks {
			return false, fmt.Sprintf("process %d of group %d started before the recorded leader", m.pid, r.PGID)
		}
	}
	return true, ""
}

// signalRecorded sends sig to r's group, and to its leader if it left the
// group (a leader that called setpgid).
func signalRecorded(r *commandRecord, sig syscall.Signal) {
	_ = syscall.Kill(-r.PGID, sig)
	if st, err := readStat(r.PGID); err == nil && st.start == r.StartTicks && st.pgrp != r.PGID {
		_ = syscall.Kill(r.PGID, sig)
	}
}

// waitGone waits up to within for r's leader and group to be gone (dead
// processes not yet reaped count as gone).
func (d *commandDir) waitGone(ctx context.Context, r *commandRecord, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		st, err := readStat(r.PGID)
		leaderLives := err == nil && st.start == r.StartTicks && !st.dead()
		if !leaderLives && len(groupMembers(r.PGID)) == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// record writes the record of a command just started as the leader pid.
func (d *commandDir) record(pid int, x taskworkers.Execution, started time.Time) error {
	d.mu.Lock()
	open, boot := d.lock != nil, d.bootID
	d.mu.Unlock()
	if !open {
		return fmt.Errorf("%w: the executors were not opened (Registry.Open)", ErrCommandDirUnusable)
	}
	st, err := readStat(pid)
	if err != nil {
		return fmt.Errorf("read the command's start time: %w", err)
	}
	r := commandRecord{PGID: pid, StartTicks: st.start, BootID: boot, RunID: x.RunID, StepID: x.StepID,
		LogicalAttemptID: x.LogicalAttemptID, EngineAttemptID: x.EngineAttemptID,
		StartedAt: started.UTC().Format(time.RFC3339Nano), Sidecar: os.Getpid()}
	b, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	path := d.path(pid)
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// forget removes the record of the group led by pid.
func (d *commandDir) forget(pid int) error {
	if err := os.Remove(d.path(pid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (d *commandDir) path(pid int) string {
	return filepath.Join(d.dir, strconv.Itoa(pid)+recordSuffix)
}

// procStat is what the executor reads of /proc/<pid>/stat.
type procStat struct {
	pid   int
	state byte
	pgrp  int
	start uint64
}

// dead reports a process that exited and is not reaped yet.
func (s procStat) dead() bool { return s.state == 'Z' || s.state == 'X' }

// readStat reads /proc/<pid>/stat.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(pid, b)
}

// parseStat parses a /proc/<pid>/stat line. The command name (field 2) may
// hold spaces and parentheses: the fields after it start after the last
// ')'.
func parseStat(pid int, b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[19] field 22 (starttime).
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields after the name, want 20 or more", pid, len(f))
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: pgrp: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: starttime: %w", pid, err)
	}
	return procStat{pid: pid, state: f[0][0], pgrp: pgrp, start: start}, nil
}

// groupMembers lists the live (not exited) processes of process group
// pgid.
func groupMembers(pgid int) []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.pgrp != pgid || st.dead() {
			continue
		}
		out = append(out, st)
	}
	return out
}
