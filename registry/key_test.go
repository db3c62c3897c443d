package registry_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/registry"
)

var validKVKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

// Unusual runIds that must work; shared with TestRegistry_RunIDs.
var oddRunIDs = map[string]string{
	"Plain":        "run-1",
	"Dot":          "run.1",
	"Star":         "run*1",
	"GreaterThan":  "run>1",
	"Space":        "run 1",
	"Wildcards":    "a.*.>",
	"Unicode":      "läuft-✓-実行-🚀",
	"Pipe":         "a|b",
	"Slash":        "a/b=c",
	"Max256ASCII":  strings.Repeat("r", 256),
	"Max256UTF8":   strings.Repeat("é", 128),
	"Max256Emoji":  strings.Repeat("🚀", 64),
	"LeadingDot":   ".run",
	"OnlyDots":     "..",
	"ControlChars": "a\tb\nc",
}

func TestKey(t *testing.T) {
	k := idemKey(1)
	for name, runID := range oddRunIDs {
		t.Run(name, func(t *testing.T) {
			key, err := registry.Key(runID, k)
			if err != nil {
				t.Fatalf("Key: %v", err)
			}
			if !validKVKey.MatchString(key) || strings.Count(key, ".") != 1 || strings.HasPrefix(key, ".") {
				t.Fatalf("Key(%q) = %q: not a valid two-token KV key", runID, key)
			}
			if len(key) > 407 {
				t.Fatalf("len(key) = %d, want <= 407", len(key))
			}
			gotRun, gotKey, err := registry.ParseKey(key)
			if err != nil || gotRun != runID || gotKey != k {
				t.Fatalf("ParseKey(%q) = %q, %q, %v; want %q, %q, nil", key, gotRun, gotKey, err, runID, k)
			}
		})
	}
	t.Run("Example", func(t *testing.T) {
		got, _ := registry.Key("run.1", k)
		if want := "cnVuLjE." + k; got != want {
			t.Fatalf("got %q want %q", got, want)
		}
	})
}

func TestKey_ErrInvalidInput(t *testing.T) {
	k := idemKey(1)
	for _, tc := range []struct {
		name, runID, key string
	}{
		{"EmptyRunID", "", k},
		{"RunID257Bytes", strings.Repeat("r", 257), k},
		{"RunID4KiB", strings.Repeat("r", 4096), k},
		{"RunIDNotUTF8", "run\xff", k},
		{"EmptyKey", "run", ""},
		{"ShortKey", "run", k[:63]},
		{"LongKey", "run", k + "0"},
		{"UppercaseKey", "run", strings.ToUpper(k)},
		{"NonHexKey", "run", "g" + k[1:]},
		{"KeyWithDot", "run", "." + k[1:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := registry.Key(tc.runID, tc.key)
			if !errors.Is(err, registry.ErrInvalidInput) {
				t.Fatalf("got %v want ErrInvalidInput", err)
			}
		})
	}
}

func TestParseKey_ErrInvalidInput(t *testing.T) {
	k := idemKey(1)
	for _, key := range []string{"", "nodot", "cnVu", "!!.", "cnVuLjE=." + k, "cnVu.short", "." + k, "cnVu." + k + ".x", "_w." + k, "cnVuLjF." + k} {
		t.Run(key, func(t *testing.T) {
			if _, _, err := registry.ParseKey(key); !errors.Is(err, registry.ErrInvalidInput) {
				t.Fatalf("ParseKey(%q): got %v want ErrInvalidInput", key, err)
			}
		})
	}
}
