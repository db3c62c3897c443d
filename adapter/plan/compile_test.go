package plan

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

func TestStepRef(t *testing.T) {
	tests := []struct{ id, ref string }{
		{"build", "s_build"},
		{"deploy.eu 1", "s_deploy_2Eeu_201"},
		{"a_b", "s_a_5Fb"},
		{"x-Y9", "s_x-Y9"},
		{"ü", "s__C3_BC"},
		{"${workflow.input.x}", "s__24_7Bworkflow_2Einput_2Ex_7D"},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			if got := StepRef(tc.id); got != tc.ref {
				t.Fatalf("StepRef(%q) = %q, want %q", tc.id, got, tc.ref)
			}
			if got, ok := StepIDFromRef(tc.ref); !ok || got != tc.id {
				t.Fatalf("StepIDFromRef(%q) = %q, %v", tc.ref, got, ok)
			}
		})
	}
	for _, ref := range []string{"", "s_", "fork_1", "join_1", "s_a_", "s_a_4", "s_a_4g", "s_a_41" /* 'A' is written as itself */, "s_a.b", "s_a_2e"} {
		if id, ok := StepIDFromRef(ref); ok {
			t.Errorf("StepIDFromRef(%q) = %q, want false", ref, id)
		}
	}
}

func FuzzStepRef(f *testing.F) {
	for _, s := range []string{"a", "deploy.eu 1", "ü", "_41", "s_a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		ref := StepRef(id)
		if !regexp.MustCompile(`^s_[A-Za-z0-9_-]*$`).MatchString(ref) {
			t.Fatalf("StepRef(%q) = %q has other characters", id, ref)
		}
		back, ok := StepIDFromRef(ref)
		if id != "" && (!ok || back != id) {
			t.Fatalf("StepIDFromRef(StepRef(%q)) = %q, %v", id, back, ok)
		}
		// A ref that decodes is the one StepRef makes (so refs are unique).
		if got, ok := StepIDFromRef(id); ok && StepRef(got) != id {
			t.Fatalf("StepIDFromRef(%q) = %q but StepRef of it is %q", id, got, StepRef(got))
		}
	})
}

func TestWorkflowName(t *testing.T) {
	// A tenant's plan version; with no tenant, the shared name plan
	// versions had before plan ids were each tenant's.
	valid := regexp.MustCompile(`^sidecar_[A-Za-z0-9_-]+_[0-9a-f]{16}$`)
	shared := regexp.MustCompile(`^sidecar_[A-Za-z0-9_-]+_[0-9a-f]{8}$`)
	names := map[string]string{}
	for _, tpv := range [][3]string{
		{"acme", "deploy", "1"}, {"acme", "deploy", "2"}, {"acme", "de.ploy", "1"}, {"acme", "de_ploy", "1"}, {"acme", "deploy_1", ""}, {"acme", "deploy", "_1"},
		{"acme", "ünï", "1"}, {"acme", "üni", "1"}, {"acme", strings.Repeat("x", 256), "1"}, {"acme", strings.Repeat("x", 255) + "y", "1"},
		{"beta", "deploy", "1"}, {"acme_deploy", "1", ""}, {"acme", "deploy_1", "x"}, {"acme_deploy_1", "", ""},
		{strings.Repeat("t", 256), "deploy", "1"}, {strings.Repeat("t", 255) + "u", "deploy", "1"},
		{"", "deploy", "1"}, {"", "deploy", "2"}, {"", "de.ploy", "1"}, {"", "de_ploy", "1"}, {"", "deploy_1", ""},
		{"", strings.Repeat("x", 256), "1"}, {"", strings.Repeat("x", 255) + "y", "1"},
	} {
		n := WorkflowName(tpv[0], tpv[1], tpv[2])
		if tpv[0] == "" && (!shared.MatchString(n) || len(n) > 8+40+1+40+1+8) ||
			tpv[0] != "" && (!valid.MatchString(n) || len(n) > 8+40+1+40+1+40+1+16) {
			t.Errorf("WorkflowName(%q, %q, %q) = %q", tpv[0], tpv[1], tpv[2], n)
		}
		if other, dup := names[n]; dup {
			t.Errorf("WorkflowName(%q, %q, %q) = WorkflowName(%s)", tpv[0], tpv[1], tpv[2], other)
		}
		names[n] = tpv[0] + "|" + tpv[1] + "|" + tpv[2]
	}
	if got := WorkflowName("acme", "deploy", "1"); got != "sidecar_acme_deploy_1_"+got[len(got)-16:] || got != WorkflowName("acme", "deploy", "1") {
		t.Fatalf("got %q", got)
	}
	if got := WorkflowName("", "deploy", "1"); got != "sidecar_deploy_1_"+got[len(got)-8:] {
		t.Fatalf("got %q", got)
	}
}

func TestCompile(t *testing.T) {
	t.Run("Definitions", func(t *testing.T) {
		p := validPlan()
		before, _ := json.Marshal(p)
		c := mustCompile(t, p)
		if after, _ := json.Marshal(p); !bytes.Equal(before, after) {
			t.Fatal("Compile changed its input")
		}
		w := c.Workflow
		if w.Name != WorkflowName("", "deploy", "2026.1") || w.Version != WorkflowVersion || w.OwnerEmail != OwnerEmail ||
			w.Restartable || w.TimeoutSeconds != 0 || w.TimeoutPolicy != "ALERT_ONLY" || w.SchemaVersion != 2 {
			t.Fatalf("workflow def %+v", w)
		}
		if !reflect.DeepEqual(w.InputParameters, WorkflowInputKeys) {
			t.Fatalf("input parameters %v", w.InputParameters)
		}
		if h, ok := ContentHashOf(&w); !ok || h != c.ContentHash {
			t.Fatalf("ContentHashOf = %q, %v; want %q", h, ok, c.ContentHash)
		}
		var names []string
		for _, td := range c.TaskDefs {
			names = append(names, td.Name)
			if td.OwnerEmail != OwnerEmail || td.RetryCount != 0 || td.TimeoutSeconds != 0 {
				t.Fatalf("task def %+v", td)
			}
		}
		if !reflect.DeepEqual(names, TaskTypes) {
			t.Fatalf("task defs %v", names)
		}
		if got := shape(w.Tasks); got != "build (notify | wait) done" {
			t.Fatalf("layout %q", got)
		}
		build := w.Tasks[0]
		td := build.TaskDefinition
		if build.Type_ != "SIMPLE" || build.Name != TaskTypeCommand || td.Name != TaskTypeCommand || td.RetryCount != 5 ||
			td.RetryDelaySeconds != 5 || td.RetryLogic != "FIXED" || td.TimeoutSeconds != 0 || td.TimeoutPolicy != "RETRY" ||
			td.ResponseTimeoutSeconds != 600+ResponseTimeoutGraceSeconds || td.OwnerEmail != OwnerEmail {
			t.Fatalf("build task %+v / %+v", build, td)
		}
		done := w.Tasks[3]
		if done.Name != TaskTypeNoop || done.TaskDefinition.RetryCount != 0 || done.TaskDefinition.ResponseTimeoutSeconds != DefaultTimeoutSeconds+ResponseTimeoutGraceSeconds {
			t.Fatalf("done task %+v", done.TaskDefinition)
		}
	})
	t.Run("InputNeverInterpolated", func(t *testing.T) {
		p := validPlan()
		p.Steps[0].Executor.Argv = []string{"echo", "${workflow.input.runId}", "${build.output.x}"}
		c := mustCompile(t, p)
		var walk func([]model.WorkflowTask)
		walk = func(ts []model.WorkflowTask) {
			for _, wt := range ts {
				for k, v := range wt.InputParameters {
					s, ok := v.(string)
					if !ok {
						continue
					}
					if strings.Contains(s, "${") && s != "${workflow.input."+k+"}" {
						t.Fatalf("input %q of %s = %q would be interpolated", k, wt.TaskReferenceName, s)
					}
				}
				for _, b := range wt.ForkTasks {
					walk(b)
				}
			}
		}
		walk(c.Workflow.Tasks)
		raw, err := base64.StdEncoding.DecodeString(c.Workflow.Tasks[0].InputParameters[InputStep].(string))
		if err != nil {
			t.Fatal(err)
		}
		var s Step
		if err := json.Unmarshal(raw, &s); err != nil || s.Executor.Argv[1] != "${workflow.input.runId}" {
			t.Fatalf("step %s: %v", raw, err)
		}
	})
	t.Run("ExactJSON", func(t *testing.T) {
		p := validPlan()
		p.Steps[0].Retries.DelaySeconds = 0
		c := mustCompile(t, p)
		b, err := c.WorkflowDefJSON()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if r, ok := m["restartable"]; !ok || r != false {
			t.Fatalf("restartable %v, %v", r, ok)
		}
		// Conductor notifies a definition's status changes only if it asks.
		if l, ok := m["workflowStatusListenerEnabled"]; !ok || l != true {
			t.Fatalf("workflowStatusListenerEnabled %v, %v", l, ok)
		}
		if n := strings.Count(string(b), `"retryDelaySeconds":`); n != len(p.Steps) {
			t.Fatalf("retryDelaySeconds present %d times, want %d: %s", n, len(p.Steps), b)
		}
		// Otherwise the same as the SDK's encoding.
		var back model.WorkflowDef
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		b1, _ := json.Marshal(back)
		b2, _ := json.Marshal(c.Workflow)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("round trip differs:\n%s\n%s", b1, b2)
		}
		tb, err := c.TaskDefsJSON()
		if err != nil {
			t.Fatal(err)
		}
		var tds []map[string]any
		if err := json.Unmarshal(tb, &tds); err != nil || len(tds) != len(c.TaskDefs) {
			t.Fatalf("task defs %s: %v", tb, err)
		}
		for _, td := range tds {
			if _, ok := td["retryDelaySeconds"]; !ok {
				t.Fatalf("task def without retryDelaySeconds: %v", td)
			}
		}
	})
	t.Run("Invalid", func(t *testing.T) {
		p := validPlan()
		p.Steps[0].DependsOn = []string{"done"}
		if _, err := Compile(p); !errors.Is(err, ErrInvalid) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestContentHash(t *testing.T) {
	base, err := ContentHash(validPlan())
	if err != nil || len(base) != 64 {
		t.Fatalf("%q, %v", base, err)
	}
	same := validPlan()
	same.Steps[3].TimeoutSeconds = DefaultTimeoutSeconds // explicit default
	if h, _ := ContentHash(same); h != base {
		t.Fatal("an explicit default changed the hash")
	}
	for name, change := range map[string]func(*Plan){
		"Description": func(p *Plan) { p.Description = "other" },
		"Timeout":     func(p *Plan) { p.Steps[0].TimeoutSeconds++ },
		"Argv":        func(p *Plan) { p.Steps[0].Executor.Argv[1] = "test" },
		"Order":       func(p *Plan) { p.Steps[2], p.Steps[3] = p.Steps[3], p.Steps[2] },
		"Policy":      func(p *Plan) { p.OnStepFailure = "" },
	} {
		p := validPlan()
		change(p)
		if h, _ := ContentHash(p); h == base {
			t.Errorf("%s: hash unchanged", name)
		}
	}
	for _, d := range []string{"", "sidecar plan sha256:abc", "sidecar plan sha256:" + strings.Repeat("G", 64), "sidecar plan sha256:" + strings.Repeat("A", 64)} {
		if _, ok := ContentHashOf(&model.WorkflowDef{Description: d}); ok {
			t.Errorf("ContentHashOf(%q) ok", d)
		}
	}
	if _, ok := ContentHashOf(nil); ok {
		t.Error("ContentHashOf(nil) ok")
	}
}

func TestTaskType(t *testing.T) {
	for _, e := range []string{ExecutorCommand, ExecutorHTTP, ExecutorNoop, ExecutorSleep} {
		if ExecutorTypeOf(TaskType(e)) != e {
			t.Errorf("%s does not round trip", e)
		}
	}
	if TaskType("x") != "" || ExecutorTypeOf("x") != "" {
		t.Error("unknown types map to something")
	}
	if len(TaskDefs()) != len(TaskTypes) {
		t.Error("TaskDefs incomplete")
	}
}
