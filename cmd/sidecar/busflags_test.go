package main

import (
	"os"
	"strings"
	"testing"
)

// TestServe_BusSinkPrefixOfTheSidecarsOwn: a nats sink whose subjects or
// stream would be the sidecar's own is refused with the configuration
// (exit 2, BUS_SINK_INVALID), before the data directory is touched.
func TestServe_BusSinkPrefixOfTheSidecarsOwn(t *testing.T) {
	for _, prefix := range []string{"sidecar", "SIDECAR", "kv_x", "a b"} {
		t.Run(prefix, func(t *testing.T) {
			dir := t.TempDir()
			code, _, errOut := run(t, "serve", "--data-dir", dir, "--bus-sink", "nats:prefix="+prefix)
			if code != exitUsage || !strings.Contains(errOut, "BUS_SINK_INVALID") || !strings.Contains(errOut, "--bus-sink") {
				t.Fatalf("exit %d, stderr %q; want exit 2 with BUS_SINK_INVALID", code, errOut)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("the data dir holds %d entries after a refused configuration", len(entries))
			}
		})
	}
}
