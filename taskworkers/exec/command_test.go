package exec_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/taskworkers/artifacts"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

func TestCommand_Execute(t *testing.T) {
	e := startStore(t)
	reg := newRegistry(t, e.store, exec.Options{KillGrace: 300 * time.Millisecond})
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		res, err := reg.Execute(ctx, execution(t, sh("echo out; echo err >&2")))
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "out\n" {
			t.Errorf("stdout: got %q", got)
		}
		if got := string(artifact(t, e.store, res, exec.KindStderr)); got != "err\n" {
			t.Errorf("stderr: got %q", got)
		}
		if res.Output["exitCode"] != 0 || res.Output["stdoutBytes"] != int64(4) || res.Output["stderrBytes"] != int64(4) {
			t.Errorf("output %v", res.Output)
		}
		if len(res.Artifacts) != 2 {
			t.Errorf("got %d artifacts want 2", len(res.Artifacts))
		}
	})
	t.Run("ExitCode", func(t *testing.T) {
		for _, code := range []string{"1", "3", "127", "255"} {
			res, err := reg.Execute(ctx, execution(t, sh("echo boom-"+code+" >&2; exit "+code)))
			if err != nil {
				t.Fatal(err)
			}
			se := wantErr(t, res, exec.CodeCommandFailed, true)
			if !strings.Contains(se.Message, "exit status "+code) || !strings.Contains(se.Message, "boom-"+code) {
				t.Errorf("message %q lacks the status or the stderr tail", se.Message)
			}
			if res.Output["exitCode"] != atoi(code) {
				t.Errorf("exitCode: got %v want %s", res.Output["exitCode"], code)
			}
			if got := string(artifact(t, e.store, res, exec.KindStderr)); got != "boom-"+code+"\n" {
				t.Errorf("stderr: got %q", got)
			}
		}
	})
	t.Run("KilledBySignal", func(t *testing.T) {
		res, err := reg.Execute(ctx, execution(t, sh("kill -SEGV $$")))
		if err != nil {
			t.Fatal(err)
		}
		se := wantErr(t, res, exec.CodeCommandFailed, true)
		if res.Output["signal"] != "SIGSEGV" || !strings.Contains(se.Message, "SIGSEGV") {
			t.Errorf("output %v message %q", res.Output, se.Message)
		}
	})
	t.Run("EnvAndWorkingDir", func(t *testing.T) {
		dir := t.TempDir()
		reg := newRegistry(t, e.store, exec.Options{BaseEnv: func() []string {
			return []string{"PATH=" + os.Getenv("PATH"), "WORKER_VAR=from-worker", "OVERRIDDEN=worker"}
		}})
		spec := sh(`echo "$WORKER_VAR|$SPEC_VAR|$OVERRIDDEN|$MY_SECRET_LEN"; pwd`)
		spec.Env = map[string]string{"SPEC_VAR": "from spec", "OVERRIDDEN": "spec", "MY_SECRET_LEN": "x"}
		spec.WorkingDir = dir
		x := execution(t, spec)
		x.Secrets = map[string]string{"MY_SECRET_LEN": "secret wins"}
		res, err := reg.Execute(ctx, x)
		wantOK(t, res, err)
		real, _ := filepath.EvalSymlinks(dir)
		want := "from-worker|from spec|spec|" + "[REDACTED]" + "\n" + real + "\n"
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != want {
			t.Errorf("got %q want %q", got, want)
		}
	})
	t.Run("Traceparent", func(t *testing.T) {
		const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		x := execution(t, sh(`echo "[$TRACEPARENT]"`))
		x.Traceparent = tp
		res, err := reg.Execute(ctx, x)
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "["+tp+"]\n" {
			t.Errorf("got %q, want the step attempt's TRACEPARENT", got)
		}
		res, err = reg.Execute(ctx, execution(t, sh(`echo "[$TRACEPARENT]"`)))
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "[]\n" {
			t.Errorf("got %q: TRACEPARENT while tracing is off", got)
		}
	})
	t.Run("RelativeToWorkingDir", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "hello.sh"), []byte("#!/bin/sh\necho hello from script\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		spec := cmd("./hello.sh")
		spec.WorkingDir = dir
		res, err := reg.Execute(ctx, execution(t, spec))
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "hello from script\n" {
			t.Errorf("got %q", got)
		}
	})
	t.Run("NoShell", func(t *testing.T) {
		res, err := reg.Execute(ctx, execution(t, cmd("echo", "$HOME", "a;b", "`x`")))
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "$HOME a;b `x`\n" {
			t.Errorf("got %q: arguments went through a shell", got)
		}
	})
	t.Run("StartFailed", func(t *testing.T) {
		dir := t.TempDir()
		noexec := filepath.Join(dir, "noexec.sh")
		if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		badDir := cmd("true")
		badDir.WorkingDir = filepath.Join(dir, "missing")
		for name, spec := range map[string]plan.ExecutorSpec{
			"NotInPath":       cmd("no-such-command-9f3a1c"),
			"NoSuchPath":      cmd(filepath.Join(dir, "missing")),
			"NotExecutable":   cmd(noexec),
			"Directory":       cmd(dir),
			"MissingWorkDir":  badDir,
			"DotRelativeMiss": cmd("./nope"),
		} {
			t.Run(name, func(t *testing.T) {
				res, err := reg.Execute(ctx, execution(t, spec))
				if err != nil {
					t.Fatal(err)
				}
				wantErr(t, res, exec.CodeCommandStartFailed, false)
				if len(res.Artifacts) != 0 {
					t.Errorf("got artifacts %v for a command that never ran", res.Artifacts)
				}
			})
		}
	})
	t.Run("TermTrapped", func(t *testing.T) {
		dir := t.TempDir()
		ready := filepath.Join(dir, "ready")
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { waitFile(t, ready); cancel() }()
		start := time.Now()
		res, err := reg.Execute(ctx, execution(t, sh(`trap 'echo got TERM; exit 7' TERM; touch `+ready+`; while :; do sleep 0.02; done`)))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepInterrupted, false)
		if res.Output["terminatedBy"] != "SIGTERM" || res.Output["exitCode"] != 7 {
			t.Errorf("output %v, want terminatedBy SIGTERM and exit code 7", res.Output)
		}
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "got TERM\n" {
			t.Errorf("stdout %q: the trap did not run", got)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("took %s", took)
		}
	})
	t.Run("TermIgnoredGetsKilled", func(t *testing.T) {
		dir := t.TempDir()
		ready := filepath.Join(dir, "ready")
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var cancelled time.Time
		done := make(chan struct{})
		go func() { defer close(done); waitFile(t, ready); cancelled = time.Now(); cancel() }()
		res, err := reg.Execute(ctx, execution(t, sh(`trap '' TERM; touch `+ready+`; while :; do sleep 0.02; done`)))
		if err != nil {
			t.Fatal(err)
		}
		<-done
		took := time.Since(cancelled)
		se := wantErr(t, res, exec.CodeStepInterrupted, false)
		if res.Output["terminatedBy"] != "SIGKILL" || res.Output["signal"] != "SIGKILL" {
			t.Errorf("output %v, want terminatedBy and signal SIGKILL", res.Output)
		}
		if !strings.Contains(se.Message, "SIGKILL after 300ms") {
			t.Errorf("message %q", se.Message)
		}
		if took < 300*time.Millisecond || took > 5*time.Second {
			t.Errorf("returned %s after the cancel, want the 300ms grace", took)
		}
	})
	t.Run("ChildrenKilledOnCancel", func(t *testing.T) {
		dir := t.TempDir()
		ready, pidFile := filepath.Join(dir, "ready"), filepath.Join(dir, "child.pid")
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { waitFile(t, ready); cancel() }()
		// The child ignores nothing, the parent waits on it: both must die.
		res, err := reg.Execute(ctx, execution(t, sh(`sleep 1000 & echo $! > `+pidFile+`; touch `+ready+`; wait`)))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepInterrupted, false)
		assertGone(t, pidFile)
	})
	t.Run("GrandchildIgnoringTermKilled", func(t *testing.T) {
		dir := t.TempDir()
		ready, pidFile := filepath.Join(dir, "ready"), filepath.Join(dir, "child.pid")
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { waitFile(t, ready); cancel() }()
		// The leader exits on TERM; a grandchild that ignores TERM is left
		// in the group and must get SIGKILL.
		res, err := reg.Execute(ctx, execution(t, sh(`sh -c "trap '' TERM; exec sleep 1000" & echo $! > `+pidFile+`; touch `+ready+`; wait`)))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepInterrupted, false)
		assertGone(t, pidFile)
	})
	t.Run("LeftoverChildrenKilledOnExit", func(t *testing.T) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "child.pid")
		start := time.Now()
		// The background sleep holds stdout open: without the group kill the
		// capture would wait for it.
		res, err := reg.Execute(ctx, execution(t, sh(`sleep 1000 & echo $! > `+pidFile+`; echo leader done`)))
		wantOK(t, res, err)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("took %s", took)
		}
		if got := string(artifact(t, e.store, res, exec.KindStdout)); got != "leader done\n" {
			t.Errorf("stdout %q", got)
		}
		assertGone(t, pidFile)
	})
	t.Run("TimeoutVsCancel", func(t *testing.T) {
		tctx, tcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer tcancel()
		res, err := reg.Execute(tctx, execution(t, cmd("sleep", "10")))
		if err != nil {
			t.Fatal(err)
		}
		se := wantErr(t, res, exec.CodeStepTimeout, true)
		if !strings.Contains(se.Message, "timed out") || res.Output["terminatedBy"] != "SIGTERM" {
			t.Errorf("message %q output %v", se.Message, res.Output)
		}
		cctx, ccancel := context.WithCancelCause(ctx)
		time.AfterFunc(200*time.Millisecond, func() { ccancel(errors.New("run cancelled by operator")) })
		res, err = reg.Execute(cctx, execution(t, cmd("sleep", "10")))
		if err != nil {
			t.Fatal(err)
		}
		se = wantErr(t, res, exec.CodeStepInterrupted, false)
		if !strings.Contains(se.Message, "run cancelled by operator") {
			t.Errorf("message %q lacks the cause", se.Message)
		}
	})
	t.Run("ContextDoneBeforeStart", func(t *testing.T) {
		dir := t.TempDir()
		marker := filepath.Join(dir, "ran")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		res, err := reg.Execute(cctx, execution(t, cmd("touch", marker)))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepInterrupted, false)
		if _, err := os.Stat(marker); err == nil {
			t.Error("the command ran")
		}
	})
	t.Run("Truncated", func(t *testing.T) {
		reg := newRegistry(t, e.store, exec.Options{MaxCaptureBytes: 100})
		res, err := reg.Execute(ctx, execution(t, sh(`i=0; while [ $i -lt 100 ]; do printf '%04d\n' $i; i=$((i+1)); done`)))
		wantOK(t, res, err)
		got := string(artifact(t, e.store, res, exec.KindStdout))
		if !strings.HasPrefix(got, "0000\n0001\n") || !strings.HasSuffix(got, "0098\n0099\n") || !strings.Contains(got, "[... 400 bytes omitted ...]") {
			t.Errorf("got %q", got)
		}
		if res.Output["stdoutBytes"] != int64(500) || res.Output["stdoutTruncated"] != true {
			t.Errorf("output %v", res.Output)
		}
	})
	t.Run("NoArtifactStore", func(t *testing.T) {
		reg := newRegistry(t, nil, exec.Options{})
		res, err := reg.Execute(ctx, execution(t, sh("echo hi")))
		wantOK(t, res, err)
		if len(res.Artifacts) != 0 || res.Output["stdoutBytes"] != int64(3) {
			t.Errorf("artifacts %v output %v", res.Artifacts, res.Output)
		}
	})
}

func TestCommand_ExecuteStoreDown(t *testing.T) {
	e := startStore(t)
	reg := newRegistry(t, e.store, exec.Options{StoreTimeout: time.Second})
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	res, err := reg.Execute(context.Background(), execution(t, sh("echo hi")))
	if err == nil {
		t.Fatalf("got no error with the artifact store down (result %+v)", res)
	}
	if res.Output["exitCode"] != 0 {
		t.Errorf("output %v: the command result should still be reported", res.Output)
	}
}

func assertGone(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(3 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %s still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// TestCommand_StoreOutageShorterThanStoreTimeout: a command that finished
// while the artifact store does not answer (a NATS leader election, a
// quorum lost for a while) keeps trying to store its output, each try
// bounded, until StoreTimeout: an outage shorter than that costs a delay,
// not a second run of the command (its task handed back and run again).
func TestCommand_StoreOutageShorterThanStoreTimeout(t *testing.T) {
	_, srv := natstest.Start(t)
	js, deaf := natstest.ConnectDeaf(t, srv)
	st, err := artifacts.Open(context.Background(), js, artifacts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t, st, exec.Options{StoreTimeout: time.Minute})
	deaf.Store(true) // requests the server never gets: no answer comes
	go func() {
		time.Sleep(3 * time.Second)
		deaf.Store(false)
	}()
	res, err := reg.Execute(context.Background(), execution(t, sh("echo hi")))
	if err != nil {
		t.Fatalf("the store answered again 3 s into a 1 minute StoreTimeout: %v", err)
	}
	if len(res.Artifacts) == 0 || res.Artifacts[0].Kind != exec.KindStdout || res.Artifacts[0].SizeBytes != 3 {
		t.Fatalf("artifacts %+v, want the stdout stored", res.Artifacts)
	}
}
