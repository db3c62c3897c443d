// Package conductortest gives tests and benchmarks the real Conductor
// server named by SIDECAR_TEST_CONDUCTOR_URL (.ci/run starts one with
// deploy/local/conductor.sh and sets it).
package conductortest

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvURL names the variable holding the Conductor API base URL, e.g.
// http://127.0.0.1:8080/api.
const EnvURL = "SIDECAR_TEST_CONDUCTOR_URL"

var (
	healthOnce sync.Once
	healthErr  error
)

// URL returns the API base URL of the test Conductor, without a trailing
// slash. Without EnvURL the test is skipped, saying how to run it; a
// Conductor that does not answer its /health (checked once per process)
// fails it.
func URL(tb testing.TB) string {
	tb.Helper()
	u := strings.TrimRight(os.Getenv(EnvURL), "/")
	if u == "" {
		tb.Skip("set " + EnvURL + " (e.g. http://127.0.0.1:8080/api, after deploy/local/conductor.sh start) to run the tests against a real Conductor")
	}
	healthOnce.Do(func() {
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(strings.TrimSuffix(u, "/api") + "/health")
		if err != nil {
			healthErr = err
			return
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			healthErr = fmt.Errorf("/health answered %s", resp.Status)
		}
	})
	if healthErr != nil {
		tb.Fatalf("%s=%s is set but Conductor is not healthy: %v", EnvURL, u, healthErr)
	}
	return u
}
