package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// failingReads fails every read of the run's state while on is set.
type failingReads struct {
	taskworkers.SnapshotReader
	on *atomic.Bool
}

func (r failingReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if r.on.Load() {
		return nil, errors.New("the state store does not answer (test)")
	}
	return r.SnapshotReader.ProjectSnapshot(ctx, runID)
}

// TestProxy_HandBacksOfOneRunDoNotWaitForEachOther: two tasks of one run
// in one poll's answer, while the run's state cannot be read, are both
// handed back to Conductor; a hand-back is a Conductor call (retried
// while Conductor does not answer), and it is made outside the run's
// lock, so the run's other tasks do not queue behind it. Conductor's
// answers to the task workers' updates are held (a front before the real
// Conductor) until both hand-backs are in flight, or for a minute.
func TestProxy_HandBacksOfOneRunDoNotWaitForEachOther(t *testing.T) {
	var fail atomic.Bool
	var mu sync.Mutex
	inFlight := map[string]int{} // task id: its updates held now
	arrived := map[string]bool{}
	most := 0 // tasks with an update held at once
	both := make(chan struct{})
	var once sync.Once
	front := func(curl string) string {
		u, err := url.Parse(curl)
		if err != nil {
			t.Fatal(err)
		}
		rp := conductortest.ReverseProxy(t, u)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tasks") && fail.Load() {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				var res struct {
					TaskID string `json:"taskId"`
				}
				_ = json.Unmarshal(body, &res)
				mu.Lock()
				inFlight[res.TaskID]++
				arrived[res.TaskID] = true
				n := 0
				for _, c := range inFlight {
					if c > 0 {
						n++
					}
				}
				most = max(most, n)
				mu.Unlock()
				if n >= 2 {
					once.Do(func() { close(both) })
				}
				select {
				case <-both:
				case <-r.Context().Done(): // the worker gave up this try
				case <-time.After(time.Minute):
				}
				mu.Lock()
				inFlight[res.TaskID]--
				mu.Unlock()
			}
			rp.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + u.Path
	}
	e := newEnvOpts(t, envOpts{
		reads: func(r taskworkers.SnapshotReader) taskworkers.SnapshotReader {
			return failingReads{SnapshotReader: r, on: &fail}
		},
		workerConductor: front,
	})
	_, _ = e.start(t, 2, 60)
	fail.Store(true)
	var handed []task
	waitFor(t, "both tasks handed back", 5*time.Minute, func() bool {
		handed = append(handed, e.pollBatch(t, 2)...)
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) >= 2
	})
	mu.Lock()
	got := most
	mu.Unlock()
	if len(handed) != 0 {
		t.Fatalf("%d tasks reached the worker while the run's state could not be read", len(handed))
	}
	if got < 2 {
		t.Fatalf("the run's two hand-backs reached Conductor one at a time (at most %d in flight): the second waited for the first", got)
	}
}
