package main

import (
	"flag"
	"slices"
	"testing"
)

// TestUnknownSettings: a SIDECAR_ variable that is no setting of serve is
// named, with the setting a letter or two away; serve's own, the other
// commands' and the tests' variables are not.
func TestUnknownSettings(t *testing.T) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs)
	got := unknownSettings([]string{
		"SIDECAR_CONCURENCY=noop=4", "SIDECAR_CONCURRENCY=noop=4", "SIDECAR_SERVER=http://x", "SIDECAR_TEST_CONDUCTOR_URL=u",
		"SIDECAR_NO_SUCH_THING_AT_ALL=1", "PATH=/bin", "SIDECAR_RETAIN_FINISHED=720h",
	}, fs)
	want := []string{
		"SIDECAR_CONCURENCY is set, but is no setting of sidecar serve: it is ignored (did you mean SIDECAR_CONCURRENCY?)",
		"SIDECAR_NO_SUCH_THING_AT_ALL is set, but is no setting of sidecar serve: it is ignored",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}
