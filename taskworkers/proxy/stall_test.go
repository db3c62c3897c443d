package proxy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// bigTaskDef registers, straight at Conductor, a task definition whose
// answer is about 6 MB (more than loopback's socket buffers hold for a
// reader that does not read, also gzipped), and removes it when the test
// ends.
func bigTaskDef(t *testing.T) string {
	t.Helper()
	curl := conductortest.URL(t)
	name := "proxy_big_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	noise := make([]byte, 3<<20)
	_, _ = rand.Read(noise) // incompressible: Conductor's gzip does not shrink it
	def, _ := json.Marshal([]map[string]any{{"name": name, "description": hex.EncodeToString(noise), "retryCount": 0,
		"timeoutSeconds": 60, "responseTimeoutSeconds": 30, "ownerEmail": "proxy-test@example.com"}})
	resp, err := http.Post(curl+"/metadata/taskdefs", "application/json", bytes.NewReader(def))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("register %s: %v %v", name, resp, err)
	}
	resp.Body.Close()
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, curl+"/metadata/taskdefs/"+name, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return name
}

// holdAnswers opens n connections to the proxy at base, asks each for the
// answer of path and never reads it.
func holdAnswers(t *testing.T, base, path string, n int) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := fmt.Fprintf(c, "GET %s%s HTTP/1.1\r\nHost: %s\r\n\r\n", u.Path, path, u.Host); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // their answers under way, and stuck
}

// within is a client that gives up after 20 s: what a worker waits.
var within = &http.Client{Timeout: 20 * time.Second}

// A worker that asks for a large answer through the proxy and does not
// read it holds a place of the polls' share, not the updates' quarter:
// with every other place held so, a worker's update still gets through.
// Before, the forwarded calls took connections to Conductor outside the
// shares, and four such workers held all four, so that every update and
// poll waited until the listener's write timeout cut them (2 minutes).
func TestProxy_AnAnswerNotReadLeavesTheUpdatesTheirPlaces(t *testing.T) {
	e := newEnvOpts(t, envOpts{proxy: func(o *proxy.Options) {
		o.MaxUpstreamConnections, o.StallTimeout, o.WriteTimeout = 4, time.Minute, time.Minute
	}})
	big := bigTaskDef(t)
	_, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	holdAnswers(t, e.url, "/metadata/taskdefs/"+big, 4)
	b, _ := json.Marshal(map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "workerId": "sdk-worker"})
	resp, err := within.Post(e.url+"/tasks", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("an update while four workers do not read their answers: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an update while four workers do not read their answers: %d", resp.StatusCode)
	}
}

// A worker that stops reading an answer is cut StallTimeout after its last
// progress, and what it held comes back: a poll of another worker gets its
// task. Before, it held its place until the write timeout (2 minutes).
func TestProxy_AnAnswerNotReadIsCut(t *testing.T) {
	e := newEnvOpts(t, envOpts{proxy: func(o *proxy.Options) {
		o.MaxUpstreamConnections, o.StallTimeout, o.WriteTimeout = 4, 500*time.Millisecond, time.Minute
	}})
	big := bigTaskDef(t)
	holdAnswers(t, e.url, "/metadata/taskdefs/"+big, 4)
	_, _ = e.start(t, 1, 60)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		q := url.Values{"workerid": {"sdk-worker"}, "count": {"1"}, "timeout": {"100"}, "domain": {e.domain}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
		resp, err := within.Do(req)
		if err != nil {
			t.Fatalf("a poll while workers do not read their answers: %v", err)
		}
		var tasks []task
		_ = json.NewDecoder(resp.Body).Decode(&tasks)
		resp.Body.Close()
		if len(tasks) == 1 {
			return
		}
	}
}
