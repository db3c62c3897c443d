package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestEscapeText(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ünïcode ✓":   "plain text, ünïcode ✓",
		"\x1b[2Jcleared":          `\u001b[2Jcleared`,
		"a\nb\tc\rd":              `a\nb\tc\rd`,
		"bell\x07 del\x7f":        `bell\u0007 del\u007f`,
		"c1 csi \u009b31m":        `c1 csi \u009b31m`,
		"bad utf8 \xff\xc2":       `bad utf8 \xff\xc2`,
		"osc \x1b]0;title\x1b\\":  `osc \u001b]0;title\u001b\`,
		"plan-\u202egnp.exe":      `plan-\u202egnp.exe`,
		"\u2066iso\u2069 \u200fm": `\u2066iso\u2069 \u200fm`,
	} {
		if got := escapeText(in); got != want {
			t.Errorf("escapeText(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSafeWriter: what reaches the terminal has no control character but
// newline and tab, a rune split across writes passes whole, and JSON
// written through it decodes to the same data.
func TestSafeWriter(t *testing.T) {
	var buf bytes.Buffer
	w := &safeWriter{w: &buf}
	for _, p := range []string{"ok\tcol\n", "\x1b[31mred", "\xc2", "\x9b", "é"[:1], "é"[1:], "\n"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if got, want := buf.String(), "ok\tcol\n\\u001b[31mred\\u009bé\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}

	buf.Reset()
	in := map[string]string{"reason": "x\x1b]0;t\x07\u009b\x7f\r\ny"}
	if err := printJSON(w, in); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	for _, r := range buf.String() {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			t.Fatalf("raw control %U in %q", r, buf.String())
		}
	}
	var out map[string]string
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil || out["reason"] != in["reason"] {
		t.Fatalf("JSON through the writer: %q (%v), want %q", out["reason"], err, in["reason"])
	}
}

// TestMain_ErrorsAreEscaped: an error that quotes user input (here a file
// name) reaches stderr without its control characters.
func TestMain_ErrorsAreEscaped(t *testing.T) {
	code, out, errOut := run(t, "run", "submit", "/nonexistent/\x1b]0;pwned\x07plan.json", "--server", "http://127.0.0.1:1")
	if code != exitError || !bytes.Contains([]byte(errOut), []byte(`\u001b]0;pwned\u0007`)) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and the name escaped", code, out, errOut)
	}
}
