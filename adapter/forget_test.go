package adapter

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestRunIndexForgetter_ForgetRun: a run's entries leave (markers
// included), a request entry that now names a later run of the same
// request stays, forgetting again is nothing, and a runId that is not one
// of the index's forgets nothing.
func TestRunIndexForgetter_ForgetRun(t *testing.T) {
	ctx := context.Background()
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{
		RetentionPermissions: natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, DefaultRunsBucket)})
	env := newNATS(t)
	r, err := OpenRuns(ctx, js, newClient(t, "http://127.0.0.1:1/api", 100*time.Millisecond), env.emitter, RunsOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.ConnectRetention()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	f := NewRunIndexForgetter(r, natsstore.NewKeyPurger(rjs))
	put := func(key string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := r.kv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	subjects := func() []string {
		t.Helper()
		st, err := js.Stream(ctx, "KV_"+DefaultRunsBucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+DefaultRunsBucket+".>"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for s := range info.State.Subjects {
			out = append(out, s)
		}
		slices.Sort(out)
		return out
	}
	// Run a (request q) and b (its own request); run c was started later
	// for request q, whose entry now names c.
	a, b, c := uuid.NewString(), uuid.NewString(), uuid.NewString()
	put(keyRun+a, Run{RunID: a, RequestKey: "q", State: RunStateFinal})
	put(keyRun+b, Run{RunID: b, RequestKey: "qb", State: RunStateFinal})
	put(keyReq+"qb", reqRecord{RunID: b})
	put(keyReq+"q", reqRecord{RunID: c})
	put(keyActive+a, nil)
	if err := r.kv.Delete(ctx, keyActive+a); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.ForgetRun(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"not-a-uuid", ">"} {
		if err := f.ForgetRun(ctx, id); err != nil {
			t.Fatalf("ForgetRun(%q): %v", id, err)
		}
	}
	p := "$KV." + DefaultRunsBucket + "."
	want := []string{p + keyReq + "q", p + keyReq + "qb", p + keyRun + b}
	if got := subjects(); !slices.Equal(got, want) {
		t.Fatalf("subjects after forgetting %s: %v, want %v", a, got, want)
	}
	if err := f.ForgetRun(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := subjects(); !slices.Equal(got, want[:1]) {
		t.Fatalf("subjects after forgetting %s: %v, want %v", b, got, want[:1])
	}
	// An adopted workflow's run has no request entry (its RequestKey,
	// "adopted:<workflowId>", is not a key): its entries leave all the same.
	d := uuid.NewString()
	put(keyRun+d, Run{RunID: d, WorkflowID: d, RequestKey: adoptedRequestKeyPrefix + d, State: RunStateFinal})
	if err := f.ForgetRun(ctx, d); err != nil {
		t.Fatalf("ForgetRun of an adopted run: %v", err)
	}
	if got := subjects(); !slices.Equal(got, want[:1]) {
		t.Fatalf("subjects after forgetting adopted run %s: %v, want %v", d, got, want[:1])
	}
}
