package httpapi_test

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestPostgresReplies_ExpiryAndStaleness: an answer is kept past
// StaleAfter (only a claim without an answer goes stale), a row older
// than the TTL is absent to a new claim, and claims delete the expired
// rows in passing.
func TestPostgresReplies_ExpiryAndStaleness(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	store, err := pgstore.Open(ctx, url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	replies, err := httpapi.OpenPostgresReplies(ctx, store.Pool(), 500*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	replies.StaleAfter = 0
	if r, err := replies.Claim(ctx, "kept", "fp"); r != nil || err != nil {
		t.Fatalf("claim: %v %v", r, err)
	}
	if err := replies.Keep(ctx, "kept", "fp", &httpapi.Reply{Status: 200, Body: []byte(`{"status":"PAUSED"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := replies.Release(ctx, "kept"); err != nil { // a release never drops an answer
		t.Fatal(err)
	}
	r, err := replies.Claim(ctx, "kept", "fp")
	if err != nil || r == nil || r.Status != 200 || string(r.Body) != `{"status":"PAUSED"}` {
		t.Fatalf("a kept answer after StaleAfter: %+v %v, want the answer", r, err)
	}
	time.Sleep(700 * time.Millisecond) // past the TTL
	if r, err := replies.Claim(ctx, "kept", "other"); r != nil || err != nil {
		t.Fatalf("an expired row: %+v %v, want a new claim", r, err)
	}
	if _, err := replies.Claim(ctx, "old", "fp"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	fresh, err := httpapi.OpenPostgresReplies(ctx, store.Pool(), 500*time.Millisecond, 0) // prunes on its first claim
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Claim(ctx, "new", "fp"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var keys []string
	if err := conn.QueryRow(ctx, "SELECT array_agg(key ORDER BY key) FROM control_replies").Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "new" {
		t.Fatalf("rows after the prune: %v, want [new]", keys)
	}
}

// TestPostgresReplies_BoundedBytes: the rows of kept answers hold at most
// MaxBytes once a claim pruned (at most once a minute); the newest
// answers stay, and the oldest key, evicted, is claimed anew: its action
// runs again.
func TestPostgresReplies_BoundedBytes(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	store, err := pgstore.Open(ctx, url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	replies, err := httpapi.OpenPostgresReplies(ctx, store.Pool(), time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	const bound = 1 << 20
	replies.MaxBytes = bound
	body := func(i int) []byte { // 50 KB that do not compress
		b := make([]byte, 25<<10)
		rand.New(rand.NewSource(int64(i))).Read(b)
		return []byte(fmt.Sprintf(`{"n":%d,"x":"%x"}`, i, b))
	}
	const keys = 60 // about 3 MB
	for i := range keys {
		key := fmt.Sprintf("bound-%d", i)
		if r, err := replies.Claim(ctx, key, "fp"); r != nil || err != nil {
			t.Fatalf("claim %d: %v %v", i, r, err)
		}
		if err := replies.Keep(ctx, key, "fp", &httpapi.Reply{Status: 200, Body: body(i)}); err != nil {
			t.Fatal(err)
		}
	}
	replies.PruneNext()
	if _, err := replies.Claim(ctx, "bound-next", "fp"); err != nil {
		t.Fatal(err)
	}
	var kept int64
	if err := store.Pool().QueryRow(ctx, "SELECT coalesce(sum(octet_length(key) + octet_length(fingerprint) + coalesce(pg_column_size(body), 0)), 0) FROM control_replies").Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept > bound {
		t.Fatalf("the kept answers hold %d bytes after %d answers of 50 KB and a prune, over the bound of %d", kept, keys, bound)
	}
	last := fmt.Sprintf("bound-%d", keys-1)
	if r, err := replies.Claim(ctx, last, "fp"); err != nil || r == nil || string(r.Body) != string(body(keys-1)) {
		t.Fatalf("the newest answer: %v, %v; want it replayed", r != nil, err)
	}
	if r, err := replies.Claim(ctx, "bound-0", "fp"); r != nil || err != nil {
		t.Fatalf("the oldest key: replayed %v, %v; want it evicted and claimed anew", r != nil, err)
	}
}

// stoppingControl's first pause stops the cluster that keeps the control
// replies, then fails as a pause does with its store down; the next ones
// answer.
type stoppingControl struct {
	recordingControl
	t       *testing.T
	cluster *pgtest.Cluster
	once    sync.Once
}

func (c *stoppingControl) Pause(ctx context.Context, runID string, req drain.PauseRequest) (*drain.State, error) {
	failed := false
	c.once.Do(func() {
		c.cluster.Stop(c.t)
		failed = true
	})
	if failed {
		return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "the store is down"}
	}
	return c.recordingControl.Pause(ctx, runID, req)
}

// TestPostgresReplies_ARetryAfterTheStoreCameBack: a 5xx answer given while
// the replies' database was down could not release the key's claim; a
// retry with the same key once the database is back runs the request (5xx
// answers are not kept), instead of answering REQUEST_IN_PROGRESS until
// the claim is stale.
func TestPostgresReplies_ARetryAfterTheStoreCameBack(t *testing.T) {
	ctx := context.Background()
	cl := pgtest.Own(t)
	store, err := pgstore.Open(ctx, cl.URL, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	replies, err := httpapi.OpenPostgresReplies(ctx, store.Pool(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	runs := memstore.New(statestore.ProjectorOptions{})
	if _, err := runs.Append(ctx, storetest.Event("run-1", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	control := &stoppingControl{t: t, cluster: cl}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: runs, Control: control, Replies: replies, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	e := &replayEnv{srv: srv}
	if a := e.post(t, "/v1/runs/run-1/pause", "k1", `{"reason":"r"}`); a.status != http.StatusServiceUnavailable {
		t.Fatalf("the pause while the store goes down: %+v, want 503", a)
	}
	cl.Start(t)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err := store.Check(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the store did not come back: %v", err)
		}
	}
	if a := e.post(t, "/v1/runs/run-1/pause", "k1", `{"reason":"r"}`); a.status != http.StatusOK {
		t.Fatalf("the retry with the same key once the store is back: %+v, want the pause run (200)", a)
	}
	if got := control.taken(); len(got) != 1 {
		t.Fatalf("pauses that reached the controller after the first: %v, want 1", got)
	}
}

// TestPostgresReplies_FrozenServerFailsWithinTheBound: the replies'
// database stops answering while its connections stay open (every
// process of the cluster stopped). A claim, a keep and a release each
// fail within the bound they were given, whatever the request's deadline.
func TestPostgresReplies_FrozenServerFailsWithinTheBound(t *testing.T) {
	ctx := context.Background()
	cl := pgtest.Own(t)
	store, err := pgstore.Open(ctx, cl.URL, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	const maxWait = time.Second
	replies, err := httpapi.OpenPostgresReplies(ctx, store.Pool(), time.Hour, maxWait)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replies.Claim(ctx, "k0", "fp"); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(ctx context.Context) error{
		"claim":   func(ctx context.Context) error { _, err := replies.Claim(ctx, "k1", "fp"); return err },
		"keep":    func(ctx context.Context) error { return replies.Keep(ctx, "k0", "fp", &httpapi.Reply{Status: 200}) },
		"release": func(ctx context.Context) error { return replies.Release(ctx, "k0") },
	}
	cl.Freeze(t) // thawed when the test ends, after its parallel subtests
	const patience = 30 * time.Second
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- call(ctx) }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("a call the server never answered succeeded")
				}
			case <-time.After(patience):
				t.Fatalf("a call the server never answered still waits after %v (max wait %v)", patience, maxWait)
			}
		})
	}
}
