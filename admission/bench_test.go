package admission_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/admission"
)

// BenchmarkStart: run starts on the real Conductor, 8 callers at once,
// through admission control (limit far away: every start is admitted) and
// straight through the adapter (the raw limit: what a start costs without
// the decider).
func BenchmarkStart(b *testing.B) {
	const n = 200
	for _, via := range []string{"adapter", "admission"} {
		b.Run(via, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				e := newEnv(b)
				var c *admission.Controller
				if via == "admission" {
					c = e.open(admission.Options{Limits: admission.Limits{Global: 1_000_000}})
				}
				began := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for w := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for k := w; k < n; k += 8 {
							req := e.request(fmt.Sprintf("t%d", k%4), fmt.Sprintf("b-%d-%d", i, k))
							var err error
							if c != nil {
								_, err = c.Submit(context.Background(), req, e.plan, "bench")
							} else {
								_, err = e.runs.StartRun(context.Background(), req)
							}
							if err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/time.Since(began).Seconds(), "starts/s")
				if c != nil {
					c.Close(context.Background())
				}
			}
		})
	}
}
