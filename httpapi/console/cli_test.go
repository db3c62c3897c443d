package console

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestCLI_CommandLines: the command lines the console offers to copy, made
// by app.js's cli() (run with Node, as a browser would run it): a run's or
// a step's id that starts with "-" goes after "--", where the CLI reads
// it as an argument, not a flag; others stay where a person writes them.
func TestCLI_CommandLines(t *testing.T) {
	src, err := os.ReadFile("static/assets/app.js")
	if err != nil {
		t.Fatal(err)
	}
	// function q and function cli, as they are in app.js.
	m := regexp.MustCompile(`(?s)function q\(s\) \{[^\n]*\}\n\n// cli\(args\).*?\nfunction cli\(args\) \{.*?\n\}\n`).Find(src)
	if m == nil {
		t.Fatal("app.js has no function q and function cli")
	}
	script := `const location = { origin: "http://127.0.0.1:8787" };
` + string(m) + `
console.log(JSON.stringify([
  cli(["retry", { pos: "run-1" }, { pos: "--server=http://evil:1" }, "--reason", "oops"]),
  cli(["retry", { pos: "run-1" }, { pos: "build" }, "--reason", "flaky disk"]),
  cli(["pause", { pos: "run-1" }, "--reason", "x", { raw: "--timeout 30s" }]),
  cli(["bus", "deadletters", "--sink", "hook"]),
]));`
	got := nodeJSON(t, script)
	want := []string{
		"sidecar retry --reason oops --server http://127.0.0.1:8787 -- run-1 --server=http://evil:1",
		"sidecar retry run-1 build --reason 'flaky disk' --server http://127.0.0.1:8787",
		"sidecar pause run-1 --reason x --timeout 30s --server http://127.0.0.1:8787",
		"sidecar bus deadletters --sink hook --server http://127.0.0.1:8787",
	}
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("command %d: %q, want %q", i, got, want[i])
		}
	}
}

// TestShown: the text the console shows has the direction controls as
// their code points (an override in an id would turn the rest of its line
// around), and nothing else changed.
func TestShown(t *testing.T) {
	src, err := os.ReadFile("static/assets/app.js")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)function shown\(s\) \{.*?\n\}\n`).Find(src)
	if m == nil {
		t.Fatal("app.js has no function shown")
	}
	script := string(m) + "\nconsole.log(JSON.stringify([shown(\"plan-\\u202Egnp.exe\"), shown(\"étape 2 — ok\"), shown(42)]));"
	got := nodeJSON(t, script)
	want := []string{"plan-<U+202E>gnp.exe", "étape 2 — ok", "42"}
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("shown %d: %q, want %q", i, got, want[i])
		}
	}
}

// nodeJSON runs script (which prints one JSON array of strings) with Node
// and returns the array; without Node the test is skipped, or fails under
// CI=true.
func nodeJSON(t *testing.T, script string) []string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is not on PATH")
		}
		t.Skip("node is not on PATH")
	}
	out, err := exec.Command(node, "-e", script).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got []string
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	return got
}
