package adapter

import (
	"strings"
	"testing"
)

func TestCheckLabels(t *testing.T) {
	valid := map[string]string{
		"team": "data", "tier": "", "app.kubernetes.io/name": "etl-nightly", "a": "b", "x_y.z-1": "V_1.2-3",
		strings.Repeat("k", 63): strings.Repeat("v", 63), "example.com/" + strings.Repeat("n", 63): "",
	}
	if p := CheckLabels(valid); len(p) != 0 {
		t.Fatalf("valid labels refused: %v", p)
	}
	for _, tt := range []struct{ key, value, want string }{
		{"", "x", "key name"},
		{"-team", "x", "key name"},
		{"team-", "x", "key name"},
		{strings.Repeat("k", 64), "x", "key name"},
		{"team", "-x", "value"},
		{"team", strings.Repeat("v", 64), "value"},
		{"team", "a b", "value"},
		{"Example.com/team", "x", "key prefix"},
		{"/team", "x", "key prefix"},
		{"example.com/", "x", "key name"},
		{"a/b/c", "x", "key name"},
		{"team", "ü", "value"},
	} {
		p := CheckLabels(map[string]string{tt.key: tt.value, "ok": "fine"})
		if len(p) != 1 || p[0].Key != tt.key || !strings.Contains(p[0].Message, tt.want) {
			t.Errorf("%q=%q: %v, want one problem on the key mentioning %q", tt.key, tt.value, p, tt.want)
		}
	}
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", 1+i%60)+string(rune('a'+i/60))] = ""
	}
	if p := CheckLabels(many); len(p) == 0 || !strings.Contains(p[0].Message, "at most 64") {
		t.Fatalf("%d labels: %v", len(many), p)
	}
}

// TestCheckLabels_LongInputIsNotEchoed: a problem with a huge key or value
// quotes the start of it, not all of it (the answer and the logs stay small).
func TestCheckLabels_LongInputIsNotEchoed(t *testing.T) {
	huge := strings.Repeat("a", 70_000)
	for _, labels := range []map[string]string{{"big": huge}, {huge: "x"}, {"example.com/" + huge: "x"}, {huge + "/x": "x"}} {
		p := CheckLabels(labels)
		if len(p) != 1 || len(p[0].Message) > 512 || len(p[0].Key) > 512 || !strings.Contains(p[0].Message, "70") {
			t.Fatalf("%d problems, message %d bytes, key %d bytes; want one, each under 512 bytes, saying how long the input was", len(p), len(p[0].Message), len(p[0].Key))
		}
	}
}
