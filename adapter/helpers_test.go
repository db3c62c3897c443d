package adapter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// unusedURL returns a base URL on a local port nothing listens on.
func unusedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return "http://127.0.0.1:" + strconv.Itoa(port) + "/api"
}

// newClient is a client of the Conductor at baseURL. Tests that only need
// Conductor to answer give it 30 s a call: Conductor 3.32 beside the
// race-enabled suite on a 2-core machine took more than 5 s to answer a
// PUT /metadata/workflow.
func newClient(t testing.TB, baseURL string, timeout time.Duration) *Client {
	t.Helper()
	c, err := NewClient(ClientOptions{BaseURL: baseURL, Timeout: timeout, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// suffix returns a random hex string that keeps names of workflows and task
// types unique across test runs on a long-lived Conductor server.
func suffix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// testPlan compiles a one-step noop plan with a fresh planId.
func testPlan(t testing.TB) *plan.Compiled {
	t.Helper()
	return compilePlan(t, &plan.Plan{
		PlanID:      "plan-" + suffix(t),
		PlanVersion: "1",
		Steps:       []plan.Step{{StepID: "step-1", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}},
	})
}

// changedPlan compiles another plan under the same planId and planVersion.
func changedPlan(t testing.TB, c *plan.Compiled) *plan.Compiled {
	t.Helper()
	p := c.Plan.Clone()
	p.Description = "changed " + suffix(t)
	return compilePlan(t, p)
}

func compilePlan(t testing.TB, p *plan.Plan) *plan.Compiled {
	t.Helper()
	c, err := plan.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// natsEnv is an embedded NATS server with the event store and the
// EventIdRegistry on it.
type natsEnv struct {
	// domain is the Conductor task domain of the runs started by this
	// environment's Runs: the sidecar task types are shared by every test
	// package using the server, and the domain keeps their tasks apart.
	domain  string
	srv     *natsstore.Embedded
	js      jetstream.JetStream
	store   *natsstore.Store
	emitter *registry.Emitter
}

func newNATS(t testing.TB) *natsEnv {
	t.Helper()
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: t.TempDir(), SyncInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	env := &natsEnv{srv: srv, domain: "adapter-test-" + suffix(t)}
	env.js = env.connect(t)
	ctx := context.Background()
	env.store, err = natsstore.Open(ctx, env.js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.store.Close() })
	reg, err := registry.Open(ctx, env.js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env.emitter = registry.NewEmitter(reg, env.store)
	return env
}

// connect opens another client connection (a replica's own).
func (e *natsEnv) connect(t testing.TB) jetstream.JetStream {
	t.Helper()
	return natstest.Connect(t, e.srv)
}

// newRuns opens a Runs on its own NATS connection and its own Conductor
// client, as a separate sidecar replica would.
func (e *natsEnv) newRuns(t testing.TB, baseURL string, opts RunsOptions) *Runs {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if opts.TaskDomain == "" {
		opts.TaskDomain = e.domain
	}
	// Conductor's answers take more than a second on a loaded machine; the
	// lease must outlast two of them.
	timeout := 10 * time.Second
	if opts.LeaseTTL > 0 {
		timeout = min(timeout, opts.LeaseTTL/2)
	}
	r, err := OpenRuns(context.Background(), e.connect(t), newClient(t, baseURL, timeout), e.emitter, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// registeredRuns gives a test its own NATS, a fresh plan and a Runs on
// baseURL with that plan registered.
func registeredRuns(t testing.TB, baseURL string, opts RunsOptions) (*natsEnv, *plan.Compiled, *Runs) {
	t.Helper()
	env := newNATS(t)
	p := testPlan(t)
	r := env.newRuns(t, baseURL, opts)
	if err := r.RegisterPlan(context.Background(), "tenant-a", p); err != nil {
		t.Fatal(err)
	}
	return env, p, r
}

// events returns the event types of runID in log order.
func (e *natsEnv) events(t testing.TB, runID string) []statestore.RunEventRecord {
	t.Helper()
	recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func countType(recs []statestore.RunEventRecord, eventType string) int {
	n := 0
	for _, r := range recs {
		if r.EventType == eventType {
			n++
		}
	}
	return n
}

func request(p *plan.Compiled, runRequestID string) StartRequest {
	return StartRequest{TenantID: "tenant-a", ProjectID: "proj-a", EnvironmentID: "dev", RunRequestID: runRequestID, Plan: p}
}

// pauses is the pause follower serve wires into the watcher (drain's, on
// this environment's JetStream), reading the runs from snaps; keys holds
// its engine ledger. It is one replica's, alone: a difference is decided
// at the first check.
func (e *natsEnv) pauses(t testing.TB, r *Runs, snaps SnapshotReader, drainTimeout time.Duration) (*drain.Follower, *drain.Keys) {
	t.Helper()
	keys, err := drain.OpenKeys(context.Background(), e.connect(t), drain.KeysOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return drain.NewFollower(snaps, e.emitter, r.Client(), keys, drain.FollowerOptions{DrainTimeout: drainTimeout, Drains: keys,
		Alone: func() bool { return true }, Logger: zaptest.NewLogger(t)}), keys
}
