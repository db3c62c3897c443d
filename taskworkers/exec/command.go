package exec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	osexec "os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// stderrInMessage bounds the stderr tail quoted in a failed command's
// error message.
const stderrInMessage = 512

// commandExecutor runs Argv without a shell in its own process group.
//
// Kill semantics: when ctx is done the whole group gets SIGTERM, and
// SIGKILL after KillGrace if the leader has not exited. When the leader
// exits (on its own or signalled), whatever is left in its group gets
// SIGKILL: a step owns its process group. All signals are sent while the
// leader is an unreaped zombie (waitid with WNOWAIT), so its pid, and thus
// the group id, cannot have been reused by an unrelated process.
// Processes that leave the group (setsid) are out of reach; if they hold
// the output pipes open, the capture stops KillGrace after the leader
// exited. With cmds, the group is recorded from right after the spawn
// until it is dead, so that a restart after the sidecar died ends it
// (leftover.go).
type commandExecutor struct {
	base
	cmds *commandDir
}

func (e *commandExecutor) Execute(ctx context.Context, x taskworkers.Execution) (taskworkers.Result, error) {
	if r, ok := checkOnly(x.Spec, plan.ExecutorCommand, "argv", "env", "workingDir"); !ok {
		return r, nil
	}
	env, r, ok := e.env(x)
	if !ok {
		return r, nil
	}
	red := secrets.NewRedactorMap(x.Secrets)
	log := e.logger(x)
	if ctx.Err() != nil {
		return taskworkers.Result{Err: ctxError(ctx, red, "the command was not started")}, nil
	}

	stdout, stderr := newCapture(e.opts.MaxCaptureBytes), newCapture(e.opts.MaxCaptureBytes)
	cmd := osexec.Command(x.Spec.Argv[0], x.Spec.Argv[1:]...)
	cmd.Env = env
	cmd.Dir = x.Spec.WorkingDir
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Its own process group, so that a cancel reaches the whole tree; and
	// SIGKILL to the leader if the sidecar dies (kill -9, OOM), so a step
	// never runs on unsupervised: Conductor redelivers its task and the
	// step would otherwise complete twice. (Linux delivers the parent-death
	// signal when the forking OS thread exits; the Go runtime keeps its
	// threads unless a goroutine exits while locked to one, which this
	// process does not do.) The rest of the group survives the leader; the
	// group's record (cmds) lets the restart end it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = e.opts.KillGrace
	started := time.Now()
	if err := cmd.Start(); err != nil {
		retryable := startRetryable(err)
		log.Warn("command did not start", zap.String("argv0", red.String(x.Spec.Argv[0])),
			zap.String("error", red.String(err.Error())), zap.Bool("retryable", retryable))
		return fail(CodeCommandStartFailed, "start "+red.String(err.Error()), retryable), nil
	}
	pid := cmd.Process.Pid
	if e.cmds != nil {
		if err := e.cmds.record(pid, x, started); err != nil {
			// Unrecorded, a restart could not end it: do not let it run.
			signalLeaderGroup(cmd.Process, syscall.SIGKILL)
			waitExitNoReap(pid)
			signalGroup(pid, syscall.SIGKILL)
			_ = e.cmds.forget(pid)
			_ = cmd.Wait()
			log.Error("could not record the command's process group; killed it", zap.Int("pgid", pid), zap.Error(err))
			return fail(CodeCommandStartFailed, "could not record the command's process group (the sidecar's data dir: "+
				red.String(err.Error())+"); free space or fix permissions in --data-dir", true), nil
		}
	}
	log.Debug("command started", zap.Int("pid", pid), zap.String("argv0", red.String(x.Spec.Argv[0])),
		zap.Int("args", len(x.Spec.Argv)-1))

	exited := make(chan struct{})
	go func() {
		defer close(exited)
		waitExitNoReap(pid)
	}()
	var sent string // the last signal the executor sent to the group because of ctx
	select {
	case <-exited:
	case <-ctx.Done():
		sent = "SIGTERM"
		log.Info("step context done; sending SIGTERM to the process group",
			zap.Int("pgid", pid), zap.NamedError("cause", ctx.Err()))
		signalLeaderGroup(cmd.Process, syscall.SIGTERM)
		grace := time.NewTimer(e.opts.KillGrace)
		select {
		case <-exited:
		case <-grace.C:
			sent = "SIGKILL"
			log.Warn("command still running after the kill grace; sending SIGKILL to the process group",
				zap.Int("pgid", pid), zap.Duration("killGrace", e.opts.KillGrace))
			signalLeaderGroup(cmd.Process, syscall.SIGKILL)
			<-exited
		}
		grace.Stop()
	}
	// The leader is a zombie now: kill what is left of its group, forget
	// the group (its id stays reserved until the reap), then reap.
	if signalGroup(pid, syscall.SIGKILL) {
		log.Info("killed processes left in the step's process group", zap.Int("pgid", pid))
	}
	if e.cmds != nil {
		if err := e.cmds.forget(pid); err != nil {
			log.Warn("could not remove the command's record; the next start finds its group gone and drops it", zap.Int("pgid", pid), zap.Error(err))
		}
	}
	waitErr := cmd.Wait()
	took := time.Since(started)

	out := map[string]any{"durationMs": took.Milliseconds()}
	outData, outTotal, outTrunc := stdout.bytes(red)
	errData, errTotal, errTrunc := stderr.bytes(red)
	out["stdoutBytes"], out["stderrBytes"] = outTotal, errTotal
	if outTrunc {
		out["stdoutTruncated"] = true
	}
	if errTrunc {
		out["stderrTruncated"] = true
	}
	var status string
	exitCode := -1
	if ps := cmd.ProcessState; ps != nil {
		exitCode = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status = "killed by signal " + unix.SignalName(ws.Signal())
			out["signal"] = unix.SignalName(ws.Signal())
		} else {
			status = fmt.Sprintf("exit status %d", exitCode)
		}
		out["exitCode"] = exitCode
	} else {
		status = "wait failed: " + red.String(fmt.Sprint(waitErr))
	}
	if sent != "" {
		out["terminatedBy"] = sent
	}
	if errors.Is(waitErr, osexec.ErrWaitDelay) {
		log.Warn("a process outside the step's group kept the output pipes open; capture stopped",
			zap.Duration("after", e.opts.KillGrace))
	}

	res := taskworkers.Result{Output: out}
	switch {
	case sent != "":
		what := "sent SIGTERM to the process group; " + status
		if sent == "SIGKILL" {
			what = fmt.Sprintf("sent SIGTERM to the process group, then SIGKILL after %s; %s", e.opts.KillGrace, status)
		}
		res.Err = ctxError(ctx, red, what)
	case exitCode != 0:
		msg := status
		if tail := messageTail(errData); tail != "" {
			msg += "; stderr: " + tail
		}
		res.Err = &statestore.StepError{Code: CodeCommandFailed, Message: msg, Retryable: true}
	}
	log.Info("command finished", zap.Int("pid", pid), zap.Int("exitCode", exitCode), zap.Duration("took", took),
		zap.Int64("stdoutBytes", outTotal), zap.Int64("stderrBytes", errTotal), zap.String("terminatedBy", sent))

	for _, a := range []struct {
		kind string
		data []byte
	}{{KindStdout, outData}, {KindStderr, errData}} {
		ref, ok, err := e.store(ctx, x, a.kind, a.data)
		if err != nil {
			log.Error("could not store the command's output", zap.Error(err))
			return res, err
		}
		if ok {
			res.Artifacts = append(res.Artifacts, ref)
		}
	}
	return res, nil
}

// env checks the spec's env, working dir, argv and the secrets and builds
// the command's environment: BaseEnv, then the spec's Env, then the
// secrets by name (later entries win).
func (e *commandExecutor) env(x taskworkers.Execution) ([]string, taskworkers.Result, bool) {
	s := x.Spec
	switch {
	case len(s.Argv) == 0 || s.Argv[0] == "":
		return nil, specInvalid("command needs a non-empty argv[0]"), false
	case strings.ContainsRune(s.WorkingDir, 0):
		return nil, specInvalid("workingDir contains a NUL byte"), false
	}
	for i, a := range s.Argv {
		if strings.ContainsRune(a, 0) {
			return nil, specInvalid("argv[%d] contains a NUL byte", i), false
		}
	}
	env := e.opts.BaseEnv()
	if x.Traceparent != "" {
		// The step attempt's trace context (W3C); the spec's env may
		// replace it.
		env = append(env, "TRACEPARENT="+x.Traceparent)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, specInvalid("env name %q is empty or contains '=' or NUL", k), false
		}
		if strings.ContainsRune(s.Env[k], 0) {
			return nil, specInvalid("env %s contains a NUL byte", k), false
		}
		env = append(env, k+"="+s.Env[k])
	}
	for _, k := range slices.Sorted(maps.Keys(x.Secrets)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, specInvalid("secret name %q cannot be an environment variable name", k), false
		}
		if strings.ContainsRune(x.Secrets[k], 0) {
			return nil, specInvalid("secret %s contains a NUL byte and cannot be passed in the environment", k), false
		}
		env = append(env, k+"="+x.Secrets[k])
	}
	return env, taskworkers.Result{}, true
}

// waitExitNoReap blocks until the process pid has exited, leaving it a
// zombie (WNOWAIT) so its pid and process group id stay reserved until
// cmd.Wait reaps it.
func waitExitNoReap(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// signalGroup sends sig to the process group pgid and reports whether some
// process received it.
func signalGroup(pgid int, sig syscall.Signal) bool {
	return syscall.Kill(-pgid, sig) == nil
}

// signalLeaderGroup sends sig to the group led by p. SIGKILL also goes to
// p itself, and SIGTERM does when the group is gone, so that a leader that
// moved to another group (setpgid) is still reached and Execute cannot
// hang on it.
func signalLeaderGroup(p *os.Process, sig syscall.Signal) {
	if !signalGroup(p.Pid, sig) || sig == syscall.SIGKILL {
		_ = p.Signal(sig)
	}
}

// startRetryable reports whether a start error may go away by itself.
func startRetryable(err error) bool {
	if errors.Is(err, osexec.ErrNotFound) || errors.Is(err, osexec.ErrDot) ||
		errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return false
	}
	for _, errno := range []syscall.Errno{syscall.ENOENT, syscall.EACCES, syscall.EPERM, syscall.ENOEXEC,
		syscall.ENOTDIR, syscall.EISDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.E2BIG, syscall.EINVAL} {
		if errors.Is(err, errno) {
			return false
		}
	}
	return true
}

// messageTail returns the last line-ish part of redacted output for an
// error message: at most stderrInMessage bytes, valid UTF-8, trimmed.
func messageTail(b []byte) string {
	b = []byte(strings.TrimSpace(string(b)))
	if len(b) > stderrInMessage {
		b = b[len(b)-stderrInMessage:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
		b = append([]byte("..."), b...)
	}
	return strings.ToValidUTF8(string(b), "?")
}
