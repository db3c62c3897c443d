package exec_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

func TestRegistry_For(t *testing.T) {
	reg := newRegistry(t, nil, exec.Options{})
	for _, typ := range []string{plan.ExecutorCommand, plan.ExecutorHTTP, plan.ExecutorNoop, plan.ExecutorSleep} {
		if e, ok := reg.For(typ); !ok || e == nil {
			t.Errorf("no executor for %s", typ)
		}
	}
	if _, ok := reg.For("shell"); ok {
		t.Error("executor for unknown type shell")
	}
	m := reg.Executors()
	if len(m) != 4 {
		t.Errorf("got %d executors want 4", len(m))
	}
	delete(m, plan.ExecutorNoop)
	if _, ok := reg.For(plan.ExecutorNoop); !ok {
		t.Error("Executors returned the registry's own map")
	}
}

func TestRegistry_ExecuteBadSpecs(t *testing.T) {
	reg := newRegistry(t, nil, exec.Options{})
	httpS := func(mod func(s *plan.ExecutorSpec)) plan.ExecutorSpec {
		s := plan.ExecutorSpec{Type: plan.ExecutorHTTP, URL: "http://127.0.0.1:1/x"}
		mod(&s)
		return s
	}
	cmdS := func(mod func(s *plan.ExecutorSpec)) plan.ExecutorSpec {
		s := plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"true"}}
		mod(&s)
		return s
	}
	cases := []struct {
		name    string
		spec    plan.ExecutorSpec
		secrets map[string]string
		code    string
		msg     string
	}{
		{"UnknownType", plan.ExecutorSpec{Type: "shell"}, nil, exec.CodeUnknownExecutor, `"shell"`},
		{"EmptyType", plan.ExecutorSpec{}, nil, exec.CodeUnknownExecutor, `""`},

		{"CommandNoArgv", cmdS(func(s *plan.ExecutorSpec) { s.Argv = nil }), nil, exec.CodeSpecInvalid, "argv[0]"},
		{"CommandEmptyArgv0", cmdS(func(s *plan.ExecutorSpec) { s.Argv = []string{"", "x"} }), nil, exec.CodeSpecInvalid, "argv[0]"},
		{"CommandNULArg", cmdS(func(s *plan.ExecutorSpec) { s.Argv = []string{"echo", "a\x00b"} }), nil, exec.CodeSpecInvalid, "argv[1]"},
		{"CommandNULDir", cmdS(func(s *plan.ExecutorSpec) { s.WorkingDir = "/tmp\x00" }), nil, exec.CodeSpecInvalid, "workingDir"},
		{"CommandEnvEquals", cmdS(func(s *plan.ExecutorSpec) { s.Env = map[string]string{"A=B": "x"} }), nil, exec.CodeSpecInvalid, "env name"},
		{"CommandEnvEmptyName", cmdS(func(s *plan.ExecutorSpec) { s.Env = map[string]string{"": "x"} }), nil, exec.CodeSpecInvalid, "env name"},
		{"CommandEnvNUL", cmdS(func(s *plan.ExecutorSpec) { s.Env = map[string]string{"A": "x\x00"} }), nil, exec.CodeSpecInvalid, "env A"},
		{"CommandSecretNUL", cmdS(func(*plan.ExecutorSpec) {}), map[string]string{"S": "abc\x00def"}, exec.CodeSpecInvalid, "secret S"},
		{"CommandSecretBadName", cmdS(func(*plan.ExecutorSpec) {}), map[string]string{"A=B": "abcdef"}, exec.CodeSpecInvalid, "secret name"},
		{"CommandWithURL", cmdS(func(s *plan.ExecutorSpec) { s.URL = "http://x" }), nil, exec.CodeSpecInvalid, "url"},
		{"CommandWithSeconds", cmdS(func(s *plan.ExecutorSpec) { s.Seconds = 1 }), nil, exec.CodeSpecInvalid, "seconds"},

		{"HTTPNoURL", httpS(func(s *plan.ExecutorSpec) { s.URL = "" }), nil, exec.CodeSpecInvalid, "url"},
		{"HTTPRelativeURL", httpS(func(s *plan.ExecutorSpec) { s.URL = "/path" }), nil, exec.CodeSpecInvalid, "absolute"},
		{"HTTPFTP", httpS(func(s *plan.ExecutorSpec) { s.URL = "ftp://host/x" }), nil, exec.CodeSpecInvalid, "absolute"},
		{"HTTPUnparsable", httpS(func(s *plan.ExecutorSpec) { s.URL = "http://[::1" }), nil, exec.CodeSpecInvalid, "parse"},
		{"HTTPBadMethod", httpS(func(s *plan.ExecutorSpec) { s.Method = "GE T" }), nil, exec.CodeSpecInvalid, "method"},
		{"HTTPUnknownSecret", httpS(func(s *plan.ExecutorSpec) { s.URL = "http://h/${secret:NOPE}" }), nil, exec.CodeSpecInvalid, "${secret:NOPE}"},
		{"HTTPUnterminated", httpS(func(s *plan.ExecutorSpec) { s.Body = "x ${secret:A" }), map[string]string{"A": "abcdef"}, exec.CodeSpecInvalid, "unterminated"},
		{"HTTPBadHeaderName", httpS(func(s *plan.ExecutorSpec) { s.Headers = map[string]string{"Bad Name": "v"} }), nil, exec.CodeSpecInvalid, "header name"},
		{"HTTPHeaderInjection", httpS(func(s *plan.ExecutorSpec) { s.Headers = map[string]string{"X": "${secret:S}"} }),
			map[string]string{"S": "evil\r\nX-Injected: 1"}, exec.CodeSpecInvalid, "header X"},
		{"HTTPBadRetryableStatus", httpS(func(s *plan.ExecutorSpec) { s.RetryableStatus = []int{42} }), nil, exec.CodeSpecInvalid, "42"},
		{"HTTPWithArgv", httpS(func(s *plan.ExecutorSpec) { s.Argv = []string{"x"} }), nil, exec.CodeSpecInvalid, "argv"},
		{"HTTPWithEnvAndDir", httpS(func(s *plan.ExecutorSpec) { s.Env = map[string]string{"A": "b"}; s.WorkingDir = "/" }), nil, exec.CodeSpecInvalid, "env, workingDir"},

		{"SleepNegative", plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: -1}, nil, exec.CodeSpecInvalid, "seconds"},
		{"SleepNaN", plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: math.NaN()}, nil, exec.CodeSpecInvalid, "seconds"},
		{"SleepInf", plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: math.Inf(1)}, nil, exec.CodeSpecInvalid, "seconds"},
		{"SleepHuge", plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 1e300}, nil, exec.CodeSpecInvalid, "seconds"},
		{"SleepWithURL", plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 1, URL: "http://x"}, nil, exec.CodeSpecInvalid, "url"},
		{"NoopWithArgv", plan.ExecutorSpec{Type: plan.ExecutorNoop, Argv: []string{"x"}}, nil, exec.CodeSpecInvalid, "argv"},
		{"NoopWithSeconds", plan.ExecutorSpec{Type: plan.ExecutorNoop, Seconds: 1}, nil, exec.CodeSpecInvalid, "seconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := execution(t, tc.spec)
			x.Secrets = tc.secrets
			res, err := reg.Execute(context.Background(), x)
			if err != nil {
				t.Fatalf("got executor error %v, want a step error", err)
			}
			se := wantErr(t, res, tc.code, false)
			if !strings.Contains(se.Message, tc.msg) {
				t.Errorf("message %q does not mention %q", se.Message, tc.msg)
			}
			for _, v := range tc.secrets {
				if strings.Contains(se.Message, v) {
					t.Errorf("message %q contains a secret value", se.Message)
				}
			}
			// The executor of the declared type must defend itself too.
			if e, ok := reg.For(tc.spec.Type); ok {
				res, err := e.Execute(context.Background(), x)
				if err != nil || res.Err == nil || res.Err.Code != tc.code {
					t.Errorf("For(%q).Execute: got %+v, %v", tc.spec.Type, res.Err, err)
				}
			}
		})
	}
	t.Run("TypeMismatch", func(t *testing.T) {
		e, _ := reg.For(plan.ExecutorHTTP)
		res, err := e.Execute(context.Background(), execution(t, plan.ExecutorSpec{Type: plan.ExecutorNoop}))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeSpecInvalid, false)
	})
}

func TestNoop_Execute(t *testing.T) {
	reg := newRegistry(t, nil, exec.Options{})
	res, err := reg.Execute(context.Background(), execution(t, plan.ExecutorSpec{Type: plan.ExecutorNoop}))
	wantOK(t, res, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err = reg.Execute(ctx, execution(t, plan.ExecutorSpec{Type: plan.ExecutorNoop}))
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, res, exec.CodeStepInterrupted, false)
}

func TestSleep_Execute(t *testing.T) {
	reg := newRegistry(t, nil, exec.Options{})
	sleep := func(s float64) plan.ExecutorSpec { return plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: s} }
	t.Run("OK", func(t *testing.T) {
		start := time.Now()
		res, err := reg.Execute(context.Background(), execution(t, sleep(0.1)))
		wantOK(t, res, err)
		if took := time.Since(start); took < 100*time.Millisecond {
			t.Errorf("slept %s", took)
		}
		if ms, _ := res.Output["sleptMs"].(int64); ms < 100 {
			t.Errorf("output %v", res.Output)
		}
	})
	t.Run("Zero", func(t *testing.T) {
		res, err := reg.Execute(context.Background(), execution(t, sleep(0)))
		wantOK(t, res, err)
	})
	t.Run("Timeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		res, err := reg.Execute(ctx, execution(t, sleep(10)))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepTimeout, true)
	})
	t.Run("Interrupted", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		res, err := reg.Execute(ctx, execution(t, sleep(10)))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepInterrupted, false)
	})
}

var _ taskworkers.Executor = (*exec.Registry)(nil)
