package plan

import (
	"errors"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// validPlan has one step of each executor, all fields used.
func validPlan() *Plan {
	return &Plan{
		PlanID: "deploy", PlanVersion: "2026.1", Description: "a plan", OnStepFailure: OnFailurePause,
		Steps: []Step{
			{StepID: "build", Executor: ExecutorSpec{Type: ExecutorCommand, Argv: []string{"make", "all"}, Env: map[string]string{"GOFLAGS": "-mod=mod"}, WorkingDir: "/src"},
				TimeoutSeconds: 600, Retries: RetryPolicy{EngineTries: 3, LogicalAttempts: 2, DelaySeconds: 5},
				Secrets: []SecretRef{{Name: "TOKEN", Ref: "env:CI_TOKEN"}, {Name: "KEY", Ref: "file:/run/secrets/key"}}},
			{StepID: "notify", Executor: ExecutorSpec{Type: ExecutorHTTP, Method: "POST", URL: "https://hooks.example/${secret:HOOK}?x=1",
				Headers: map[string]string{"Authorization": "Bearer ${secret:TOKEN}", "Content-Type": "application/json"},
				Body:    `{"text":"built ${secret:TOKEN}"}`, RetryableStatus: []int{429, 503}},
				DependsOn: []string{"build"}, Secrets: []SecretRef{{Name: "HOOK", Ref: "env:HOOK"}, {Name: "TOKEN", Ref: "env:TOKEN"}}},
			{StepID: "wait", Executor: ExecutorSpec{Type: ExecutorSleep, Seconds: 2.5}, DependsOn: []string{"build"}, TimeoutSeconds: 10},
			{StepID: "done", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"notify", "wait"}},
		},
	}
}

func TestValidate(t *testing.T) {
	if err := Validate(validPlan()); err != nil {
		t.Fatalf("valid plan: %v", err)
	}
	long := strings.Repeat("x", statestore.MaxIDBytes+1)
	tests := []struct {
		name   string
		change func(p *Plan)
		code   string
		path   string
	}{
		{"PlanIDMissing", func(p *Plan) { p.PlanID = "" }, CodeBadID, "planId"},
		{"PlanIDTooLong", func(p *Plan) { p.PlanID = long }, CodeBadID, "planId"},
		{"PlanIDPipe", func(p *Plan) { p.PlanID = "a|b" }, CodeBadID, "planId"},
		{"PlanIDNotUTF8", func(p *Plan) { p.PlanID = "a\xffb" }, CodeBadID, "planId"},
		{"PlanIDNUL", func(p *Plan) { p.PlanID = "a\x00b" }, CodeBadID, "planId"},
		{"PlanVersionMissing", func(p *Plan) { p.PlanVersion = "" }, CodeBadID, "planVersion"},
		{"PlanVersionPipe", func(p *Plan) { p.PlanVersion = "1|2" }, CodeBadID, "planVersion"},
		{"DescriptionTooLong", func(p *Plan) { p.Description = strings.Repeat("d", MaxDescriptionBytes+1) }, CodeBadDescription, "description"},
		{"DescriptionNotUTF8", func(p *Plan) { p.Description = "\xff" }, CodeBadDescription, "description"},
		{"OnStepFailureUnknown", func(p *Plan) { p.OnStepFailure = "ignore" }, CodeBadPolicy, "onStepFailure"},
		{"OnStepFailureCase", func(p *Plan) { p.OnStepFailure = "Pause" }, CodeBadPolicy, "onStepFailure"},
		{"NoSteps", func(p *Plan) { p.Steps = nil }, CodeNoSteps, "steps"},
		{"TooManySteps", func(p *Plan) {
			p.Steps = nil
			for i := 0; i <= MaxSteps; i++ {
				p.Steps = append(p.Steps, Step{StepID: strings.Repeat("s", 1+i%7) + string(rune('a'+i%26)) + strings.Repeat("z", i/182), Executor: ExecutorSpec{Type: ExecutorNoop}})
			}
		}, CodeTooManySteps, "steps"},
		{"StepIDMissing", func(p *Plan) { p.Steps[2].StepID = "" }, CodeBadID, "steps[2].stepId"},
		{"StepIDTooLong", func(p *Plan) { p.Steps[2].StepID = long }, CodeBadID, "steps[2].stepId"},
		{"StepIDPipe", func(p *Plan) { p.Steps[2].StepID = "w|x" }, CodeBadID, "steps[2].stepId"},
		{"StepIDNotUTF8", func(p *Plan) { p.Steps[2].StepID = "\xc3" }, CodeBadID, "steps[2].stepId"},
		{"DuplicateStep", func(p *Plan) { p.Steps[2].StepID = "build" }, CodeDuplicateStep, "steps[2].stepId"},
		{"UnknownDependency", func(p *Plan) { p.Steps[3].DependsOn = []string{"notify", "nope"} }, CodeUnknownDependency, "steps[3].dependsOn[1]"},
		{"EmptyDependency", func(p *Plan) { p.Steps[3].DependsOn = []string{""} }, CodeUnknownDependency, "steps[3].dependsOn[0]"},
		{"DependencyCase", func(p *Plan) { p.Steps[3].DependsOn = []string{"Build"} }, CodeUnknownDependency, "steps[3].dependsOn[0]"},
		{"SelfDependency", func(p *Plan) { p.Steps[2].DependsOn = []string{"build", "wait"} }, CodeSelfDependency, "steps[2].dependsOn[1]"},
		{"DuplicateDependency", func(p *Plan) { p.Steps[3].DependsOn = []string{"wait", "notify", "wait"} }, CodeDuplicateDependency, "steps[3].dependsOn[2]"},
		{"Cycle", func(p *Plan) { p.Steps[0].DependsOn = []string{"done"} }, CodeCycle, "steps[0].dependsOn[0]"},
		{"TimeoutNegative", func(p *Plan) { p.Steps[0].TimeoutSeconds = -1 }, CodeBadTimeout, "steps[0].timeoutSeconds"},
		{"TimeoutTooLong", func(p *Plan) { p.Steps[0].TimeoutSeconds = MaxTimeoutSeconds + 1 }, CodeBadTimeout, "steps[0].timeoutSeconds"},
		{"EngineTriesNegative", func(p *Plan) { p.Steps[0].Retries.EngineTries = -1 }, CodeBadRetries, "steps[0].retries.engineTries"},
		{"EngineTriesTooMany", func(p *Plan) { p.Steps[0].Retries.EngineTries = MaxEngineTries + 1 }, CodeBadRetries, "steps[0].retries.engineTries"},
		{"LogicalAttemptsNegative", func(p *Plan) { p.Steps[0].Retries.LogicalAttempts = -2 }, CodeBadRetries, "steps[0].retries.logicalAttempts"},
		{"LogicalAttemptsTooMany", func(p *Plan) { p.Steps[0].Retries.LogicalAttempts = MaxLogicalAttempts + 1 }, CodeBadRetries, "steps[0].retries.logicalAttempts"},
		{"DelayNegative", func(p *Plan) { p.Steps[0].Retries.DelaySeconds = -1 }, CodeBadRetries, "steps[0].retries.delaySeconds"},
		{"DelayTooLong", func(p *Plan) { p.Steps[0].Retries.DelaySeconds = MaxRetryDelaySeconds + 1 }, CodeBadRetries, "steps[0].retries.delaySeconds"},
		{"SecretNameBad", func(p *Plan) { p.Steps[0].Secrets[0].Name = "1TOKEN" }, CodeBadSecret, "steps[0].secrets[0].name"},
		{"SecretNameDash", func(p *Plan) { p.Steps[0].Secrets[0].Name = "MY-TOKEN" }, CodeBadSecret, "steps[0].secrets[0].name"},
		{"SecretNameEmpty", func(p *Plan) { p.Steps[0].Secrets[0].Name = "" }, CodeBadSecret, "steps[0].secrets[0].name"},
		{"SecretNameTooLong", func(p *Plan) { p.Steps[0].Secrets[0].Name = strings.Repeat("A", MaxSecretNameBytes+1) }, CodeBadSecret, "steps[0].secrets[0].name"},
		{"SecretDuplicate", func(p *Plan) { p.Steps[0].Secrets[1].Name = "TOKEN" }, CodeBadSecret, "steps[0].secrets[1].name"},
		{"SecretRefScheme", func(p *Plan) { p.Steps[0].Secrets[0].Ref = "vault:x" }, CodeBadSecret, "steps[0].secrets[0].ref"},
		{"SecretRefEnvBad", func(p *Plan) { p.Steps[0].Secrets[0].Ref = "env:" }, CodeBadSecret, "steps[0].secrets[0].ref"},
		{"SecretRefFileRelative", func(p *Plan) { p.Steps[0].Secrets[1].Ref = "file:secrets/key" }, CodeBadSecret, "steps[0].secrets[1].ref"},
		{"SecretRefFileNUL", func(p *Plan) { p.Steps[0].Secrets[1].Ref = "file:/a\x00b" }, CodeBadSecret, "steps[0].secrets[1].ref"},
		{"ExecutorTypeMissing", func(p *Plan) { p.Steps[3].Executor.Type = "" }, CodeBadExecutor, "steps[3].executor.type"},
		{"ExecutorTypeUnknown", func(p *Plan) { p.Steps[3].Executor.Type = "shell" }, CodeBadExecutor, "steps[3].executor.type"},
		{"ExecutorTypeCase", func(p *Plan) { p.Steps[3].Executor.Type = "Noop" }, CodeBadExecutor, "steps[3].executor.type"},
		{"NoopWithArgv", func(p *Plan) { p.Steps[3].Executor.Argv = []string{"x"} }, CodeBadExecutor, "steps[3].executor.argv"},
		{"CommandWithURL", func(p *Plan) { p.Steps[0].Executor.URL = "http://x" }, CodeBadExecutor, "steps[0].executor.url"},
		{"CommandWithSeconds", func(p *Plan) { p.Steps[0].Executor.Seconds = 1 }, CodeBadExecutor, "steps[0].executor.seconds"},
		{"HTTPWithEnv", func(p *Plan) { p.Steps[1].Executor.Env = map[string]string{} }, CodeBadExecutor, "steps[1].executor.env"},
		{"SleepWithBody", func(p *Plan) { p.Steps[2].Executor.Body = "x" }, CodeBadExecutor, "steps[2].executor.body"},
		{"CommandNoArgv", func(p *Plan) { p.Steps[0].Executor.Argv = nil }, CodeBadExecutor, "steps[0].executor.argv"},
		{"CommandEmptyProgram", func(p *Plan) { p.Steps[0].Executor.Argv = []string{"", "x"} }, CodeBadExecutor, "steps[0].executor.argv[0]"},
		{"CommandArgNUL", func(p *Plan) { p.Steps[0].Executor.Argv = []string{"echo", "a\x00"} }, CodeBadExecutor, "steps[0].executor.argv[1]"},
		{"CommandEnvName", func(p *Plan) { p.Steps[0].Executor.Env = map[string]string{"A=B": "x"} }, CodeBadExecutor, `steps[0].executor.env["A=B"]`},
		{"CommandEnvIsSecret", func(p *Plan) { p.Steps[0].Executor.Env = map[string]string{"TOKEN": "x"} }, CodeBadExecutor, `steps[0].executor.env["TOKEN"]`},
		{"CommandEnvValueNUL", func(p *Plan) { p.Steps[0].Executor.Env = map[string]string{"X": "\x00"} }, CodeBadExecutor, `steps[0].executor.env["X"]`},
		{"CommandWorkingDirRelative", func(p *Plan) { p.Steps[0].Executor.WorkingDir = "src" }, CodeBadExecutor, "steps[0].executor.workingDir"},
		{"HTTPMethodUnknown", func(p *Plan) { p.Steps[1].Executor.Method = "TRACE" }, CodeBadExecutor, "steps[1].executor.method"},
		{"HTTPURLMissing", func(p *Plan) { p.Steps[1].Executor.URL = "" }, CodeBadExecutor, "steps[1].executor.url"},
		{"HTTPURLRelative", func(p *Plan) { p.Steps[1].Executor.URL = "/hooks" }, CodeBadExecutor, "steps[1].executor.url"},
		{"HTTPURLScheme", func(p *Plan) { p.Steps[1].Executor.URL = "ftp://x/y" }, CodeBadExecutor, "steps[1].executor.url"},
		{"HTTPURLNoHost", func(p *Plan) { p.Steps[1].Executor.URL = "http:///x" }, CodeBadExecutor, "steps[1].executor.url"},
		{"HTTPURLMalformed", func(p *Plan) { p.Steps[1].Executor.URL = "http://x y/%zz" }, CodeBadExecutor, "steps[1].executor.url"},
		{"HTTPURLUnknownSecret", func(p *Plan) { p.Steps[1].Executor.URL = "https://x/${secret:NOPE}" }, CodeBadSecret, "steps[1].executor.url"},
		{"HTTPURLMalformedPlaceholder", func(p *Plan) { p.Steps[1].Executor.URL = "https://x/${secret:HOOK" }, CodeBadSecret, "steps[1].executor.url"},
		{"HTTPHeaderName", func(p *Plan) { p.Steps[1].Executor.Headers = map[string]string{"Bad Name": "x"} }, CodeBadExecutor, `steps[1].executor.headers["Bad Name"]`},
		{"HTTPHeaderValueCRLF", func(p *Plan) { p.Steps[1].Executor.Headers = map[string]string{"X": "a\r\nB: c"} }, CodeBadExecutor, `steps[1].executor.headers["X"]`},
		{"HTTPHeaderUnknownSecret", func(p *Plan) { p.Steps[1].Executor.Headers = map[string]string{"X": "${secret:KEY}"} }, CodeBadSecret, `steps[1].executor.headers["X"]`},
		{"HTTPBodyUnknownSecret", func(p *Plan) { p.Steps[1].Executor.Body = "${secret:OTHER}" }, CodeBadSecret, "steps[1].executor.body"},
		{"HTTPBodyBadPlaceholderName", func(p *Plan) { p.Steps[1].Executor.Body = "${secret:A-B}" }, CodeBadSecret, "steps[1].executor.body"},
		{"HTTPRetryableStatus", func(p *Plan) { p.Steps[1].Executor.RetryableStatus = []int{503, 200} }, CodeBadExecutor, "steps[1].executor.retryableStatus[1]"},
		{"SleepZero", func(p *Plan) { p.Steps[2].Executor.Seconds = 0 }, CodeBadExecutor, "steps[2].executor.seconds"},
		{"SleepNegative", func(p *Plan) { p.Steps[2].Executor.Seconds = -1 }, CodeBadExecutor, "steps[2].executor.seconds"},
		{"SleepNotBelowTimeout", func(p *Plan) { p.Steps[2].Executor.Seconds = 10 }, CodeBadExecutor, "steps[2].executor.seconds"},
		{"SleepNotBelowDefaultTimeout", func(p *Plan) { p.Steps[2].TimeoutSeconds = 0; p.Steps[2].Executor.Seconds = DefaultTimeoutSeconds }, CodeBadExecutor, "steps[2].executor.seconds"},
		{"StepTooLarge", func(p *Plan) { p.Steps[1].Executor.Body = strings.Repeat("b", MaxStepBytes) }, CodeTooLarge, "steps[1]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := validPlan()
			tc.change(p)
			err := Validate(p)
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			if ve.Code != CodePlanInvalid || !errors.Is(err, ErrInvalid) {
				t.Fatalf("code %q, want %q", ve.Code, CodePlanInvalid)
			}
			if !ve.Has(tc.code, tc.path) {
				t.Fatalf("got %v, want %s at %s", ve.Problems, tc.code, tc.path)
			}
			// A bad or duplicate stepId also leaves dependencies on it
			// unresolved; everything else is exactly one problem.
			if len(ve.Problems) != 1 && tc.name != "TooManySteps" && !strings.HasPrefix(tc.name, "StepID") && tc.name != "DuplicateStep" {
				t.Fatalf("got %d problems, want 1: %v", len(ve.Problems), ve.Problems)
			}
			if ve.Error() == "" {
				t.Fatal("empty message")
			}
		})
	}
}

// TestValidate_HTTPMethodDefaults: as docs/executors.md says and the
// executor does, a missing method is GET and the method's case is free
// (the validator once refused a missing method).
func TestValidate_HTTPMethodDefaults(t *testing.T) {
	for _, m := range []string{"", "post", "Get", "DELETE"} {
		p := validPlan()
		p.Steps[1].Executor.Method = m
		if err := Validate(p); err != nil {
			t.Errorf("method %q: %v", m, err)
		}
	}
}

func TestValidate_Problems(t *testing.T) {
	t.Run("AllReported", func(t *testing.T) {
		p := validPlan()
		p.PlanID = ""
		p.Steps[0].Retries.EngineTries = 99
		p.Steps[1].Executor.Method = "GOT"
		p.Steps[3].DependsOn = []string{"x"}
		err := Validate(p)
		var ve *ValidationError
		if !errors.As(err, &ve) || len(ve.Problems) != 4 {
			t.Fatalf("got %v, want 4 problems", err)
		}
		for _, want := range []struct{ code, path, step string }{
			{CodeBadID, "planId", ""},
			{CodeBadRetries, "steps[0].retries.engineTries", "build"},
			{CodeBadExecutor, "steps[1].executor.method", "notify"},
			{CodeUnknownDependency, "steps[3].dependsOn[0]", "done"},
		} {
			found := false
			for _, pr := range ve.Problems {
				found = found || pr.Code == want.code && pr.Path == want.path && pr.StepID == want.step
			}
			if !found {
				t.Errorf("missing %+v in %v", want, ve.Problems)
			}
		}
		if !strings.Contains(err.Error(), "4 problems") {
			t.Errorf("message %q", err.Error())
		}
	})
	t.Run("CyclePath", func(t *testing.T) {
		p := &Plan{PlanID: "c", PlanVersion: "1", Steps: []Step{
			{StepID: "a", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"c"}},
			{StepID: "b", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"a"}},
			{StepID: "c", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"x0", "b"}},
			{StepID: "x0", Executor: ExecutorSpec{Type: ExecutorNoop}},
			{StepID: "d", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"e"}},
			{StepID: "e", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"d"}},
		}}
		var ve *ValidationError
		if !errors.As(Validate(p), &ve) || len(ve.Problems) != 2 {
			t.Fatalf("got %v, want 2 cycles", ve)
		}
		want := []Problem{
			{Code: CodeCycle, Path: "steps[0].dependsOn[0]", StepID: "a", Message: `dependency cycle: "a" -> "c" -> "b" -> "a" (each step depends on the next)`},
			{Code: CodeCycle, Path: "steps[4].dependsOn[0]", StepID: "d", Message: `dependency cycle: "d" -> "e" -> "d" (each step depends on the next)`},
		}
		for _, w := range want {
			found := false
			for _, p := range ve.Problems {
				found = found || p == w
			}
			if !found {
				t.Errorf("missing %+v in %+v", w, ve.Problems)
			}
		}
	})
	t.Run("Capped", func(t *testing.T) {
		p := &Plan{PlanID: "c", PlanVersion: "1"}
		for i := 0; i < MaxProblems+10; i++ {
			p.Steps = append(p.Steps, Step{StepID: "s" + strings.Repeat("x", i), Executor: ExecutorSpec{Type: "bad"}})
		}
		var ve *ValidationError
		if !errors.As(Validate(p), &ve) || len(ve.Problems) != MaxProblems+1 || ve.Problems[MaxProblems].Code != CodeTooManyProblems {
			t.Fatalf("got %d problems", len(ve.Problems))
		}
	})
	t.Run("Nil", func(t *testing.T) {
		if err := Validate(nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("DefaultsValid", func(t *testing.T) {
		// Zero values mean defaults, and Normalize keeps a plan valid.
		p := &Plan{PlanID: "p", PlanVersion: "v", Steps: []Step{{StepID: "s", Executor: ExecutorSpec{Type: ExecutorHTTP, Method: "GET", URL: "http://127.0.0.1:1/"}}}}
		if err := Validate(p); err != nil {
			t.Fatal(err)
		}
		p.Normalize()
		if err := Validate(p); err != nil {
			t.Fatal(err)
		}
		s := p.Steps[0]
		if p.OnStepFailure != OnFailureFail || s.TimeoutSeconds != DefaultTimeoutSeconds || s.Retries.EngineTries != 1 || s.Retries.LogicalAttempts != 1 || len(s.Executor.RetryableStatus) != len(DefaultRetryableStatus) {
			t.Fatalf("normalized %+v", p)
		}
	})
	t.Run("UnicodeIDs", func(t *testing.T) {
		p := &Plan{PlanID: "плaн 1.0", PlanVersion: "v1 (β)", Steps: []Step{
			{StepID: "ステップ.1", Executor: ExecutorSpec{Type: ExecutorNoop}},
			{StepID: "step with spaces", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"ステップ.1"}},
		}}
		if err := Validate(p); err != nil {
			t.Fatal(err)
		}
	})
}

func TestExpandPlaceholders(t *testing.T) {
	got, err := ExpandPlaceholders("a ${secret:X} b ${secret:Y}${secret:X} ${other}", map[string]string{"X": "1", "Y": "${secret:X}"})
	if err != nil || got != "a 1 b ${secret:X}1 ${other}" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := ExpandPlaceholders("${secret:Z}", map[string]string{"X": "1"}); err == nil || strings.Contains(err.Error(), "1") {
		t.Fatalf("missing secret: %v", err)
	}
	if _, err := ExpandPlaceholders("${secret:X", map[string]string{"X": "1"}); err == nil {
		t.Fatal("malformed placeholder accepted")
	}
}
