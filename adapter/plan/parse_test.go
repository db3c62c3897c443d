package plan

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const richJSON = `{
  "planId": "deploy",
  "planVersion": "2026.1",
  "description": "a plan",
  "onStepFailure": "pause",
  "steps": [
    {"stepId": "build", "executor": {"type": "command", "argv": ["make", "all"], "env": {"GOFLAGS": "-mod=mod"}, "workingDir": "/src"},
     "timeoutSeconds": 600, "retries": {"engineTries": 3, "logicalAttempts": 2, "delaySeconds": 5},
     "secrets": [{"name": "TOKEN", "ref": "env:CI_TOKEN"}, {"name": "KEY", "ref": "file:/run/secrets/key"}]},
    {"stepId": "notify", "executor": {"type": "http", "method": "POST", "url": "https://hooks.example/${secret:HOOK}?x=1",
       "headers": {"Authorization": "Bearer ${secret:TOKEN}", "Content-Type": "application/json"},
       "body": "{\"text\":\"built ${secret:TOKEN}\"}", "retryableStatus": [429, 503]},
     "dependsOn": ["build"], "secrets": [{"name": "HOOK", "ref": "env:HOOK"}, {"name": "TOKEN", "ref": "env:TOKEN"}]},
    {"stepId": "wait", "executor": {"type": "sleep", "seconds": 2.5}, "dependsOn": ["build"], "timeoutSeconds": 10},
    {"stepId": "done", "executor": {"type": "noop"}, "dependsOn": ["notify", "wait"]}
  ]
}`

const richYAML = `
planId: deploy
planVersion: "2026.1"
description: a plan
onStepFailure: pause
steps:
  - stepId: build
    executor:
      type: command
      argv: [make, all]
      env: {GOFLAGS: -mod=mod}
      workingDir: /src
    timeoutSeconds: 600
    retries: {engineTries: 3, logicalAttempts: 2, delaySeconds: 5}
    secrets:
      - {name: TOKEN, ref: "env:CI_TOKEN"}
      - name: KEY
        ref: file:/run/secrets/key
  - stepId: notify
    executor:
      type: http
      method: POST
      url: https://hooks.example/${secret:HOOK}?x=1
      headers:
        Authorization: Bearer ${secret:TOKEN}
        Content-Type: application/json
      body: |-
        {"text":"built ${secret:TOKEN}"}
      retryableStatus: [429, 0x1F7]
    dependsOn: [build]
    secrets: [{name: HOOK, ref: "env:HOOK"}, {name: TOKEN, ref: "env:TOKEN"}]
  - stepId: wait
    executor: {type: sleep, seconds: 2.5}
    dependsOn: [build]
    timeoutSeconds: 10
  - stepId: done
    executor: {type: noop}
    dependsOn: [notify, wait]
`

func TestParse(t *testing.T) {
	t.Run("JSON", func(t *testing.T) {
		p, err := Parse([]byte(richJSON))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p, validPlan()) {
			t.Fatalf("got %+v\nwant %+v", p, validPlan())
		}
	})
	t.Run("YAMLEqualsJSON", func(t *testing.T) {
		j, err := ParseJSON([]byte(richJSON))
		if err != nil {
			t.Fatal(err)
		}
		y, err := Parse([]byte(richYAML))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(j, y) {
			jb, _ := json.Marshal(j)
			yb, _ := json.Marshal(y)
			t.Fatalf("YAML %s\nJSON %s", yb, jb)
		}
	})
	t.Run("BOMAndWhitespace", func(t *testing.T) {
		if _, err := Parse([]byte("\xef\xbb\xbf \n" + richJSON + "\n\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := Parse([]byte("\xef\xbb\xbf" + richYAML)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("NullFieldIsAbsent", func(t *testing.T) {
		p, err := Parse([]byte(`{"planId":"p","planVersion":"1","description":null,"steps":[{"stepId":"s","executor":{"type":"noop"},"dependsOn":null}]}`))
		if err != nil || p.Description != "" || p.Steps[0].DependsOn != nil {
			t.Fatalf("got %+v, %v", p, err)
		}
		y, err := Parse([]byte("planId: p\nplanVersion: '1'\ndescription:\nsteps:\n- stepId: s\n  executor: {type: noop}\n"))
		if err != nil || !reflect.DeepEqual(p, y) {
			t.Fatalf("YAML got %+v, %v", y, err)
		}
	})
	t.Run("YAMLTimestampIsString", func(t *testing.T) {
		p, err := Parse([]byte("planId: p\nplanVersion: 2026-01-31\nsteps: [{stepId: s, executor: {type: noop}}]\n"))
		if err != nil || p.PlanVersion != "2026-01-31" {
			t.Fatalf("got %+v, %v", p, err)
		}
	})

	const ok = `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"noop"}}]}`
	bad := []struct {
		name, doc, code, path string
	}{
		{"UnknownField", `{"planId":"p","planVersion":"1","owner":"x","steps":[]}`, CodeUnknownField, "owner"},
		{"CaseVariant", `{"planID":"p","planVersion":"1","steps":[]}`, CodeUnknownField, "planID"},
		{"CaseVariantNested", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"Type":"noop"}}]}`, CodeUnknownField, "steps[0].executor.Type"},
		{"UnknownRetryField", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"noop"},"retries":{"max":2}}]}`, CodeUnknownField, "steps[0].retries.max"},
		{"DuplicateKey", `{"planId":"p","planId":"q","planVersion":"1","steps":[]}`, CodeDuplicateKey, "planId"},
		{"DuplicateHeader", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"http","headers":{"A":"1","A":"2"}}}]}`, CodeDuplicateKey, `steps[0].executor.headers["A"]`},
		{"TrailingData", ok + `{}`, CodeSyntax, ""},
		{"TrailingGarbage", ok + ` x`, CodeSyntax, ""},
		{"Truncated", ok[:len(ok)-3], CodeSyntax, "steps[0].executor.type"},
		{"StringForInt", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"noop"},"timeoutSeconds":"60"}]}`, CodeBadType, "steps[0].timeoutSeconds"},
		{"FractionForInt", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"noop"},"retries":{"engineTries":1.5}}]}`, CodeBadType, "steps[0].retries.engineTries"},
		{"HugeInt", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"noop"},"timeoutSeconds":1e30}]}`, CodeBadType, "steps[0].timeoutSeconds"},
		{"NumberForString", `{"planId":"p","planVersion":1.0,"steps":[]}`, CodeBadType, "planVersion"},
		{"BoolForString", `{"planId":true,"planVersion":"1","steps":[]}`, CodeBadType, "planId"},
		{"ObjectForList", `{"planId":"p","planVersion":"1","steps":{}}`, CodeBadType, "steps"},
		{"NullInList", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"command","argv":["a",null]}}]}`, CodeBadType, "steps[0].executor.argv[1]"},
		{"NullStep", `{"planId":"p","planVersion":"1","steps":[null]}`, CodeBadType, "steps[0]"},
		{"NumberInEnv", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"command","env":{"A":1}}}]}`, CodeBadType, `steps[0].executor.env["A"]`},
		{"InfiniteSeconds", `{"planId":"p","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"sleep","seconds":1e999}}]}`, CodeBadType, "steps[0].executor.seconds"},
		{"InvalidUTF8", `{"planId":"p` + "\xff" + `","planVersion":"1","steps":[]}`, CodeSyntax, ""},
		{"TooLarge", `{"description":"` + strings.Repeat("x", MaxPlanBytes) + `"}`, CodeTooLarge, ""},
		{"Empty", ``, CodeSyntax, ""},
		{"JSONNull", `null`, CodeBadType, ""},
		{"YAMLList", "- a\n- b\n", CodeBadType, ""},
		{"YAMLAlias", "planId: &x p\nplanVersion: *x\nsteps: []\n", CodeSyntax, "planVersion"},
		{"YAMLMergeKey", "planId: p\nplanVersion: '1'\nsteps:\n- stepId: s\n  executor:\n    <<: {type: noop}\n", CodeSyntax, "steps[0].executor"},
		{"YAMLTwoDocuments", "planId: p\n---\nplanId: q\n", CodeSyntax, ""},
		{"YAMLCustomTag", "planId: !secret p\n", CodeSyntax, "planId"},
		{"YAMLBinary", "planId: !!binary aGVsbG8=\n", CodeSyntax, "planId"},
		{"YAMLInf", "planId: p\nplanVersion: '1'\nsteps: [{stepId: s, executor: {type: sleep, seconds: .inf}}]\n", CodeSyntax, "steps[0].executor.seconds"},
		{"YAMLUnquotedVersion", "planId: p\nplanVersion: 1.0\nsteps: []\n", CodeBadType, "planVersion"},
		{"YAMLUnknownField", "planId: p\nplanVersion: '1'\nStepS: []\n", CodeUnknownField, "StepS"},
		{"YAMLDuplicateKey", "planId: p\nplanId: q\n", CodeDuplicateKey, "planId"},
		{"YAMLSyntax", "planId: [p\n", CodeSyntax, ""},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Code != CodePlanInvalid {
				t.Fatalf("got %v, want a PLAN_INVALID *ValidationError", err)
			}
			if !ve.Has(tc.code, tc.path) {
				t.Fatalf("got %v, want %s at %q", ve.Problems, tc.code, tc.path)
			}
		})
	}
}

func TestPlan_UnmarshalJSON(t *testing.T) {
	var req struct {
		Plan *Plan `json:"plan"`
	}
	if err := json.Unmarshal([]byte(`{"plan":`+richJSON+`}`), &req); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(req.Plan, validPlan()) {
		t.Fatalf("got %+v", req.Plan)
	}
	err := json.Unmarshal([]byte(`{"plan":{"planId":"p","PlanVersion":"1"}}`), &req)
	var ve *ValidationError
	if !errors.As(err, &ve) || !ve.Has(CodeUnknownField, "PlanVersion") {
		t.Fatalf("got %v", err)
	}
	// A plan marshals back to JSON that parses to the same plan.
	b, err := json.Marshal(validPlan())
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseJSON(b)
	if err != nil || !reflect.DeepEqual(p, validPlan()) {
		t.Fatalf("round trip: %+v, %v", p, err)
	}
}

func TestParseFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, name := range []string{"p.json", "p.JSON", "p.plan"} {
		if _, err := ParseFile(write(name, richJSON)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"p.yaml", "p.yml", "p.txt"} {
		if _, err := ParseFile(write(name, richYAML)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// The extension decides: YAML in a .json file is refused.
	if _, err := ParseFile(write("y.json", richYAML)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("YAML in .json: %v", err)
	}
	if _, err := ParseFile(filepath.Join(dir, "missing.json")); err == nil || errors.Is(err, ErrInvalid) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := ParseFile(write("big.yaml", "description: "+strings.Repeat("x", MaxPlanBytes))); !errors.Is(err, ErrInvalid) {
		t.Fatalf("big file: %v", err)
	}
}

// TestExamples checks the shipped example plans: valid, the JSON and YAML
// files the same plan, and compiled to a -> {b, c} -> d.
func TestExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "local", "plans")
	j, err := ParseFile(filepath.Join(dir, "diamond.json"))
	if err != nil {
		t.Fatal(err)
	}
	y, err := ParseFile(filepath.Join(dir, "diamond.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(j, y) {
		t.Fatalf("diamond.json and diamond.yaml differ:\n%+v\n%+v", j, y)
	}
	c, err := Compile(j)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := shape(c.Workflow.Tasks), "prepare (build-a | build-b) publish"; got != want {
		t.Fatalf("layout %q, want %q", got, want)
	}
	checkCompiledOrder(t, c.Plan, c, true, 5, newRand(3))
	hy, _ := ContentHash(y)
	if hy != c.ContentHash {
		t.Fatal("JSON and YAML hash differently")
	}
	// The quickstart's plan (deploy/local/quickstart.sh relies on its shape).
	q, err := ParseFile(filepath.Join(dir, "quickstart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cq, err := Compile(q)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := shape(cq.Workflow.Tasks), "prepare (build-a | build-b | build-c) publish"; got != want {
		t.Fatalf("quickstart layout %q, want %q", got, want)
	}
}
