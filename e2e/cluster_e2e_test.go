package e2e

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// natsCluster is a 3-node JetStream cluster this test started
// (deploy/local/nats-cluster.sh) in a directory and on ports of its own.
type natsCluster struct{ env []string }

// startNATSCluster starts one, or skips the test unless
// SIDECAR_TEST_NATS_CLUSTER=1 (.ci/run sets it).
func startNATSCluster(t *testing.T) *natsCluster {
	t.Helper()
	if os.Getenv("SIDECAR_TEST_NATS_CLUSTER") != "1" {
		t.Skip("SIDECAR_TEST_NATS_CLUSTER=1 runs a 3-node NATS cluster (deploy/local/nats-cluster.sh)")
	}
	base := freeClusterPorts(t)
	c := &natsCluster{env: append(os.Environ(), "NATS_CLUSTER_DIR="+t.TempDir(), "NATS_CLUSTER_PORT="+strconv.Itoa(base))}
	t.Cleanup(func() { c.run(t, "stop") })
	c.run(t, "start")
	return c
}

// freeClusterPorts returns a base port whose nine ports (node N takes
// PORT+N-1, +2000 and +4000) are free now, below the kernel's ephemeral
// range (32768 and up) that other tests' listeners and connections use.
func freeClusterPorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(6000)
		free := true
		for _, off := range []int{0, 1, 2, 2000, 2001, 2002, 4000, 4001, 4002} {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+off))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no base port with nine free ports")
	return 0
}

func (c *natsCluster) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "deploy", "local", "nats-cluster.sh"), args...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nats-cluster.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *natsCluster) url(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "deploy", "local", "nats-cluster.sh"), "url")
	cmd.Env = c.env
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestE2E_NATSClusterR3: serve --nats-replicas 3 on a 3-node cluster
// creates the event stream, every bucket and the object store with three
// replicas; a node killed with SIGKILL loses nothing and runs go on; a
// replica count larger than the cluster is refused at start, in one line.
func TestE2E_NATSClusterR3(t *testing.T) {
	t.Parallel() // its own serve and data dir
	cl := startNATSCluster(t)
	url := cl.url(t)

	// Larger than the cluster: refused before anything is created.
	out, err := proctest.CombinedOutput(exec.Command(sidecartest.Binary(t), "serve", "--conductor-url", "http://127.0.0.1:1/api", "--nats-url", url,
		"--nats-replicas", "5", "--listen", sidecartest.FreeAddr(t), "--insecure-no-auth"))
	if err == nil || !strings.Contains(string(out), "--nats-replicas 5: the NATS cluster") {
		t.Fatalf("--nats-replicas 5 on 3 nodes: %v\n%s", err, out)
	}

	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", url, "--nats-replicas", "3")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := js.StreamNames(ctx)
	var streams []string
	for name := range names.Name() {
		streams = append(streams, name)
		info, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := info.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
	}
	if len(streams) < 9 || !strings.Contains(strings.Join(streams, " "), natsstore.DefaultStream) {
		t.Fatalf("streams %v: want the event stream, seven KV buckets and the object store", streams)
	}

	pl := mustPlan(t, `{"planId":"`+uniq("e2e-r3")+`","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"noop"}},
		{"stepId":"b","executor":{"type":"noop"},"dependsOn":["a"]}]}`)
	first := submit(t, p, pl, uniq("req")).RunID
	if v := waitTerminal(t, p, first, 60*time.Second); v.Status != "COMPLETED" {
		t.Fatalf("first run %s", v.Status)
	}
	before := allEvents(t, p, first)

	cl.run(t, "kill", "2")
	// While the streams that had their leader on node 2 elect another, the
	// API answers 503 *_UNAVAILABLE: a client retries with the same
	// runRequestId (docs/jetstream.md, "Replicas").
	req, began := uniq("req"), time.Now()
	var second string
	for {
		started, err := p.client.Start(ctx, httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: req, Plan: pl})
		var apiErr *httpapi.Error
		if err == nil {
			second = started.RunID
			break
		}
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || time.Since(began) > 30*time.Second {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("start accepted %v after node 2 was killed", time.Since(began).Round(time.Millisecond))
	if v := waitTerminal(t, p, second, 60*time.Second); v.Status != "COMPLETED" {
		t.Fatalf("run after a node was killed: %s", v.Status)
	}
	if after := allEvents(t, p, first); len(after) != len(before) {
		t.Fatalf("the first run had %d events, %d after a node died", len(before), len(after))
	}
	assertNoDuplicateKeys(t, allEvents(t, p, second))

	// Node 2 back (a replica that starts while a stream has no leader
	// starts again until it has one: docs/jetstream.md). A replica
	// started with a lower --nats-replicas uses the streams as they are
	// and says, in one warning naming them, that its own flag is what to
	// change, never lowering the streams' copies.
	cl.run(t, "start")
	other := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", url, "--nats-replicas", "1")
	logged, err := os.ReadFile(other.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	if want := natsstore.DefaultStream + "=3"; !strings.Contains(string(logged), want) || !strings.Contains(string(logged), `"fix": "--nats-replicas 3"`) ||
		strings.Contains(string(logged), "--replicas 1") {
		t.Fatalf("the log of a replica started with --nats-replicas 1: want %q named with the fix --nats-replicas 3, and no advice to lower the streams:\n%s",
			want, sidecartest.Tail(string(logged), 30))
	}
}

// TestServe_NATSReplicasNeedACluster: --nats-replicas 3 on a NATS server
// that is not clustered refuses to start, in one line, before it creates
// anything.
func TestServe_NATSReplicasNeedACluster(t *testing.T) {
	admin, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "e2e-admin-pw", Permissions: natsstore.AllPermissions})
	out, err := proctest.CombinedOutput(exec.Command(sidecartest.Binary(t), "serve", "--conductor-url", "http://127.0.0.1:1/api", "--nats-url", srv.URL(),
		"--nats-replicas", "3", "--listen", sidecartest.FreeAddr(t)))
	if err == nil || !strings.Contains(string(out), "--nats-replicas 3: the NATS server at") || !strings.Contains(string(out), "is not part of a cluster") {
		t.Fatalf("--nats-replicas 3 on one server: %v\n%s", err, out)
	}
	for name := range admin.StreamNames(context.Background()).Name() {
		t.Errorf("stream %s created before the refusal", name)
	}
}
