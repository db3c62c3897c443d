package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestE2E_NATSNodeFrozen: the NATS node a sidecar is connected to stops
// answering without closing its connections (SIGSTOP: a hung host, a
// network partition). The sidecar leaves it for another node of the
// cluster within its ping timeout and goes on: a run started after the
// freeze completes while the node stays frozen. With nats.go's default
// pings (2 minutes, two outstanding) the connection looked alive for 4 to
// 6 minutes, and every request on it waited out its timeout meanwhile.
func TestE2E_NATSNodeFrozen(t *testing.T) {
	t.Parallel() // its own cluster, serve and data dir
	cl := startNATSCluster(t)
	id := uniq("e2e-frozen")
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", cl.url(t), "--nats-replicas", "3", "--worker-id", id)
	node := cl.nodeOf(t, "sidecar "+id)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-frozen")+`","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"noop"}},
		{"stepId":"b","executor":{"type":"noop"},"dependsOn":["a"]}]}`)

	cl.run(t, "freeze", node)
	t.Cleanup(func() { cl.run(t, "thaw", node) }) // before the cluster stops
	frozen := time.Now()
	// Within the ping timeout (about 20 s), then the cluster's own recovery (its
	// streams' leaders on the frozen node replaced): 28 - 94 s measured.
	const within = 150 * time.Second
	req := uniq("req")
	var runID string
	for runID == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		started, err := p.client.Start(ctx, httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: req, Plan: pl})
		cancel()
		var apiErr *httpapi.Error
		switch {
		case err == nil:
			runID = started.RunID
		case time.Since(frozen) > within:
			t.Fatalf("no run started %v after node %s froze: %v", within, node, err)
		case errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests:
			t.Fatal(err)
		default:
			time.Sleep(500 * time.Millisecond) // the client repeats a 5xx with the same runRequestId
		}
	}
	v := waitTerminalOr(p, runID, within-time.Since(frozen))
	if v == nil || v.Status != "COMPLETED" {
		t.Fatalf("run %s started after node %s froze: %+v %v after the freeze, want COMPLETED", runID, node, v, time.Since(frozen).Round(time.Second))
	}
	t.Logf("node %s frozen: a run started and completed %v after", node, time.Since(frozen).Round(time.Second))
	if again := cl.nodeOf(t, "sidecar "+id); again == node {
		t.Fatalf("the sidecar is still connected to the frozen node %s", node)
	}
}

// nodeOf returns the number ("1" to "3") of the node that has a client
// connection named name, from each node's monitoring endpoint (connz).
// A frozen node does not answer: it is skipped.
func (c *natsCluster) nodeOf(t *testing.T, name string) string {
	t.Helper()
	base := 0
	for _, kv := range c.env {
		if v, ok := strings.CutPrefix(kv, "NATS_CLUSTER_PORT="); ok {
			base, _ = strconv.Atoi(v)
		}
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		for n := 1; n <= 3; n++ {
			res, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/connz?limit=1024", base+n-1+4000))
			if err != nil {
				continue
			}
			var connz struct {
				Connections []struct {
					Name string `json:"name"`
				} `json:"connections"`
			}
			err = json.NewDecoder(res.Body).Decode(&connz)
			res.Body.Close()
			if err != nil {
				continue
			}
			for _, cn := range connz.Connections {
				if cn.Name == name {
					return strconv.Itoa(n)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no node of the cluster has a connection named %q", name)
		}
	}
}
