package httpapi_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkControl measures a control call through the API with the real
// JetStream KV reply store: without an Idempotency-Key, the first call
// with a key (claim + keep), and a replayed call (one KV read).
func BenchmarkControl(b *testing.B) {
	e := newReplayEnvTB(b, "jetstream")
	post := func(key string) {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/runs/run-1/pause", strings.NewReader(""))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.Run("no-key", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			post("")
		}
	})
	b.Run("first-with-key", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			post(fmt.Sprintf("bench-first-%d-%d", b.N, i))
		}
	})
	post("bench-replay")
	b.Run("replayed", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			post("bench-replay")
		}
	})
}
