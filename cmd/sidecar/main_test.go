package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	m := &Main{Stdout: &out, Stderr: &errb}
	code = m.Run(context.Background(), args)
	return code, out.String(), errb.String()
}

func TestKeyCommand_Vectors(t *testing.T) {
	b, err := statestore.Contract.ReadFile("contract/RunEvents.v2.0.1.idempotency_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []struct {
		Name, RunID, EventType, PlanID, PlanVersion, ExpectedSha256Hex string
		StepID                                                         *string
		LogicalAttemptID                                               int64
	}
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			args := []string{"key", "--run-id", v.RunID, "--attempt", strconv.FormatInt(v.LogicalAttemptID, 10),
				"--event-type", v.EventType, "--plan-id", v.PlanID, "--plan-version", v.PlanVersion}
			if v.StepID != nil {
				args = append(args, "--step-id", *v.StepID)
			}
			// An unknown type (allowed by the contract) needs --extension.
			if !statestore.IsKnownEvent(v.EventType) {
				args = append(args, "--extension")
			}
			code, out, errOut := run(t, args...)
			if code != 0 || out != v.ExpectedSha256Hex+"\n" || errOut != "" {
				t.Fatalf("exit %d stdout %q stderr %q, want %s", code, out, errOut, v.ExpectedSha256Hex)
			}
		})
	}
}

func TestKeyCommand_BadInput(t *testing.T) {
	ok := []string{"--run-id", "r", "--attempt", "1", "--event-type", "RunStarted", "--plan-id", "p", "--plan-version", "1"}
	without := func(flag string) []string {
		var out []string
		for i := 0; i < len(ok); i += 2 {
			if ok[i] != flag {
				out = append(out, ok[i], ok[i+1])
			}
		}
		return out
	}
	with := func(flag, value string) []string {
		return append(without(flag), flag, value)
	}
	tests := map[string][]string{
		"missing run-id":        without("--run-id"),
		"missing attempt":       without("--attempt"),
		"missing event-type":    without("--event-type"),
		"missing plan-id":       without("--plan-id"),
		"missing plan-version":  without("--plan-version"),
		"attempt zero":          with("--attempt", "0"),
		"attempt negative":      with("--attempt", "-3"),
		"attempt not a number":  with("--attempt", "two"),
		"pipe in run-id":        with("--run-id", "a|b"),
		"pipe in plan-version":  with("--plan-version", "1|2"),
		"step-id on run event":  append(append([]string{}, ok...), "--step-id", "s"),
		"step event no step-id": with("--event-type", "StepStarted"),
		"unknown flag":          append(append([]string{}, ok...), "--tenant-id", "t"),
		"stray argument":        append(append([]string{}, ok...), "extra"),
		"run-id too long":       with("--run-id", strings.Repeat("r", statestore.MaxIDBytes+1)),
	}
	for name, args := range tests {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := run(t, append([]string{"key"}, args...)...)
			if code != 2 || out != "" || !strings.Contains(errOut, "Usage: sidecar key") {
				t.Fatalf("exit %d stdout %q stderr %q; want exit 2, usage on stderr, empty stdout", code, out, errOut)
			}
		})
	}
}

func TestMain_Commands(t *testing.T) {
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "sidecar ") {
		t.Fatalf("version: exit %d %q", code, out)
	}
	if code, _, errOut := run(t, "nope"); code != 2 || !strings.Contains(errOut, "unknown command") {
		t.Fatalf("unknown command: exit %d %q", code, errOut)
	}
	// A slip of a letter or two is named, in a line that stays on the
	// screen (not above the whole help); --version is version.
	if code, _, errOut := run(t, "stauts", "abc"); code != 2 || !strings.Contains(errOut, `did you mean "status"?`) || strings.Contains(errOut, "Commands:") {
		t.Fatalf("a misspelt command: exit %d %q, want the command it is close to and no full help", code, errOut)
	}
	if code, out, _ := run(t, "--version"); code != 0 || !strings.HasPrefix(out, "sidecar ") {
		t.Fatalf("--version: exit %d %q", code, out)
	}
	// A misspelt flag is named too.
	if code, _, errOut := run(t, "serve", "--data-dri", "x"); code != 2 || !strings.Contains(errOut, "did you mean --data-dir?") {
		t.Fatalf("a misspelt flag: exit %d %q, want the flag it is close to", code, errOut)
	}
	if code, _, _ := run(t); code != 2 {
		t.Fatalf("no command: exit %d", code)
	}
	if code, out, _ := run(t, "key", "-h"); code != exitOK || !strings.Contains(out, "-run-id") {
		t.Fatalf("key -h: exit %d %q", code, out)
	}
}

func TestDemoCommand(t *testing.T) {
	dir := t.TempDir()
	for i := 0; i < 2; i++ { // a second run on the same data dir continues the log
		code, out, errOut := run(t, "demo", "--data-dir", dir)
		if code != 0 {
			t.Fatalf("demo exit %d: %s", code, errOut)
		}
		for _, want := range []string{"substatus DRAINING, in flight [extract load]", "duplicate: existing record returned",
			"rejected: SCHEMA_VALIDATION_FAILED (field stepId)", `"status": "COMPLETED"`} {
			if !strings.Contains(out, want) {
				t.Fatalf("demo output lacks %q:\n%s", want, out)
			}
		}
	}
}

// TestKeyCommand_UnknownEventType: an event type outside the contract and
// its extensions is a usage error (exit 2, the known types listed, no key)
// unless --extension says it is intended.
func TestKeyCommand_UnknownEventType(t *testing.T) {
	args := []string{"key", "--run-id", "r", "--attempt", "1", "--event-type", "NoSuchEvent", "--plan-id", "p", "--plan-version", "1"}
	code, out, errOut := run(t, args...)
	if code != exitUsage || out != "" || !strings.Contains(errOut, "NoSuchEvent") ||
		!strings.Contains(errOut, statestore.RunDrainTimedOut) || !strings.Contains(errOut, statestore.StepStarted) {
		t.Fatalf("exit %d stdout %q stderr %q; want exit 2, no key, the known types listed", code, out, errOut)
	}
	code, out, errOut = run(t, append(args, "--extension")...)
	want := statestore.KeyInput{RunID: "r", LogicalAttemptID: 1, EventType: "NoSuchEvent", PlanID: "p", PlanVersion: "1"}.Key()
	if code != exitOK || out != want+"\n" {
		t.Fatalf("--extension: exit %d stdout %q stderr %q; want the key %s", code, out, errOut, want)
	}
}
