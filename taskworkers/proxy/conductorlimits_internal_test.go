package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestNesting: the depth Conductor's parser counts: the outermost value 1,
// brackets inside strings (escaped quotes too) not at all.
func TestNesting(t *testing.T) {
	for body, want := range map[string]int{
		`"x"`:                    0,
		`{}`:                     1,
		`{"a":[1,{"b":[]}]}`:     4,
		`{"a":"[[[[{{{{"}`:       1,
		`{"a":"\"[[[","b":[[]]}`: 3,
		`[[["\\"],[]]]`:          3,
		`{"a":"\\\\\"{{{\\\\"}`:  1,
		strings.Repeat("[", 1001) + strings.Repeat("]", 1001): 1001,
	} {
		if !json.Valid([]byte(body)) {
			t.Fatalf("%s is not JSON", body)
		}
		if got := nesting([]byte(body)); got != want {
			t.Errorf("nesting(%s) = %d, want %d", body, got, want)
		}
	}
}

// FuzzNesting: on any well-formed JSON, nesting agrees with the depth of
// the decoded value.
func FuzzNesting(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"[{"}`, `[[1,[2]],{"x":{"y":"\"]"}}]`, `"\\\""`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var v any
		if json.Unmarshal([]byte(s), &v) != nil {
			return
		}
		if got, want := nesting([]byte(s)), depthOf(v); got != want {
			t.Fatalf("nesting(%q) = %d, decoded depth %d", s, got, want)
		}
	})
}

func depthOf(v any) int {
	d := 0
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			d = max(d, depthOf(e))
		}
		return d + 1
	case []any:
		for _, e := range x {
			d = max(d, depthOf(e))
		}
		return d + 1
	}
	return 0
}
