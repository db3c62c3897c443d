package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestMain stops the PostgreSQL cluster pgtest started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// TestNode_Retention: a node with retention creates a removable log,
// removes a finished run once archived (as the retention user, on the
// external server), keeps an open one, and exports the log's size.
func TestNode_Retention(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	dir := filepath.Join(t.TempDir(), "archive")
	keys, err := archive.ParseKeys([]byte("node-retention-test-key-0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + dir, ArchiveKeys: keys,
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	reg := prometheus.NewRegistry()
	n := New(cfg, zaptest.NewLogger(t), reg)
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event("node-done", statestore.RunStarted, ""), storetest.Event("node-done", statestore.RunCompleted, ""),
		storetest.Event("node-open", statestore.RunStarted, ""),
	} {
		if _, err := n.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, err := n.store.Fetch(ctx, "node-done", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the finished run was not removed within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if recs, _ := n.store.Fetch(ctx, "node-open", 0, 0); len(recs) != 1 {
		t.Fatalf("the open run has %d records, want 1", len(recs))
	}
	// Its manifest is signed with the node's key.
	rep, err := archive.Verify(ctx, archive.NewDir(dir), archive.VerifyOptions{Keys: keys})
	if err != nil || len(rep.Problems) != 0 || rep.Runs != 1 || rep.Records != 2 || rep.Signed != 1 {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	if err := n.Ready(ctx); err != nil {
		t.Fatalf("Ready after a removal: %v", err)
	}
	// Its snapshot left with it (the event ids too: RunKeys).
	snaps, err := n.js.KeyValue(ctx, natsstore.DefaultSnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.Get(ctx, natsstore.RunToken("node-done")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("snapshot of the removed run: %v, want ErrKeyNotFound", err)
	}
	// So did its row of the run list (this replica learns by its watch);
	// the open run's stays.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		page, err := n.list.List(runlist.Filter{}, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Runs) == 1 && page.Runs[0].RunID == "node-open" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run list after the removal: %+v, want node-open only", page.Runs)
		}
	}
	if got, err := testutil.GatherAndCount(reg, "sidecar_log_records", "sidecar_retention_runs_removed_total", "sidecar_archive_failing"); err != nil || got != 3 {
		t.Fatalf("retention and log size metrics: %d series, %v", got, err)
	}
	// The API reads the removed run from the archive.
	resp, err := http.Get("http://" + cfg.API.Addr().String() + "/v1/runs/node-done")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var view struct {
		Status   string `json:"status"`
		Archived bool   `json:"archived"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil || resp.StatusCode != http.StatusOK || !view.Archived || view.Status != statestore.RunStatusCompleted {
		t.Fatalf("status of the removed run: %d %+v %v, want COMPLETED from the archive", resp.StatusCode, view, err)
	}
}

// TestNode_RetentionForgetsEveryRunKey: after a retention pass, no key of
// the removed run is left in any bucket that keeps keys per run (markers
// included: the buckets' streams are scanned by subject), while the keys
// of an open run stay.
func TestNode_RetentionForgetsEveryRunKey(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + filepath.Join(t.TempDir(), "archive"),
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	done, open := uuid.NewString(), uuid.NewString()
	runsKV, err := n.js.KeyValue(ctx, adapter.DefaultRunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	admitKV, err := n.js.KeyValue(ctx, admission.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	// Each run gets every per-run key the components write: the run
	// index's entries (as the adapter writes them, with the marker an
	// ended active entry leaves), a drain mark and a resume ended (markers
	// too), an engine ledger entry, an alert mark, its event ids and its
	// snapshot (through the emitter).
	for _, id := range []string{done, open} {
		reqKey := adapter.RequestKey("t", "p", "e", "plan", "1", id)
		rec, _ := json.Marshal(adapter.Run{RunID: id, RequestKey: reqKey, State: adapter.RunStateFinal})
		req, _ := json.Marshal(map[string]string{"runId": id})
		for k, v := range map[string][]byte{"run." + id: rec, "req." + reqKey: req, "active." + id: nil} {
			if _, err := runsKV.Put(ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
		if err := runsKV.Delete(ctx, "active."+id); err != nil {
			t.Fatal(err)
		}
		if err := n.pauseKeys.MarkDraining(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		if err := n.pauseKeys.EndDraining(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		if err := n.pauseKeys.ScheduleResume(ctx, drain.ScheduledResume{RunID: id, Cycle: 1, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := n.pauseKeys.EndResume(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		if err := n.pauseKeys.NoteEngine(ctx, id, true, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := n.gate.First(ctx, id, uuid.NewString()); err != nil {
			t.Fatal(err)
		}
		admitted, _ := json.Marshal(map[string]string{"runId": id, "state": "started"})
		if _, err := admitKV.Put(ctx, "r."+natsstore.RunToken(id), admitted); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event(open, statestore.RunStarted, ""),
		storetest.Event(done, statestore.RunStarted, ""), storetest.Event(done, statestore.RunCompleted, ""),
	} {
		if _, err := n.emitter.Emit(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	// The run's keys as they appear in subjects: by runId, by run token,
	// and the request entry by its key.
	marks := func(id string) []string {
		return []string{id, natsstore.RunToken(id), adapter.RequestKey("t", "p", "e", "plan", "1", id)}
	}
	buckets := []string{adapter.DefaultRunsBucket, drain.DefaultBucket, natsstore.DefaultAlertBucket, admission.Bucket, natsstore.DefaultSnapshotBucket, registry.DefaultBucket}
	subjectsOf := func(id string) map[string][]string {
		t.Helper()
		found := map[string][]string{}
		for _, b := range buckets {
			st, err := n.js.Stream(ctx, "KV_"+b)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+b+".>"))
			if err != nil {
				t.Fatal(err)
			}
			for subj := range info.State.Subjects {
				for _, m := range marks(id) {
					if strings.Contains(subj, m) {
						found[b] = append(found[b], subj)
						break
					}
				}
			}
		}
		return found
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, err := n.store.Fetch(ctx, done, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the finished run was not removed within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if left := subjectsOf(done); len(left) != 0 {
		t.Errorf("keys of the removed run left: %v", left)
	}
	kept := subjectsOf(open)
	for _, b := range []string{adapter.DefaultRunsBucket, drain.DefaultBucket, natsstore.DefaultAlertBucket, admission.Bucket, registry.DefaultBucket} {
		if len(kept[b]) == 0 {
			t.Errorf("the open run has no key left in %s, want its keys kept", b)
		}
	}
	if got := len(kept[adapter.DefaultRunsBucket]); got != 3 {
		t.Errorf("the open run has %d subjects in the run index, want 3 (run, req, active marker): %v", got, kept[adapter.DefaultRunsBucket])
	}
}

// startWorkflow starts, then terminates, a one-task workflow in the node's
// Conductor and returns its id.
// cancelledRunOfWorkflow appends a run of a new (terminated) workflow to
// n's log, started and cancelled, and returns the workflow's id.
func cancelledRunOfWorkflow(t *testing.T, n *Node, runID string) string {
	t.Helper()
	ctx := context.Background()
	wf := startWorkflow(t, n.conductor)
	started := storetest.Event(runID, statestore.RunStarted, "")
	started.Payload, _ = json.Marshal(statestore.RunStartedPayload{EngineRunRef: statestore.ConductorRunRef("wf", wf), EngineType: "conductor", StartedAt: time.Now().UTC().Format(time.RFC3339Nano)})
	for _, w := range []*statestore.RunEventWrite{started, storetest.Event(runID, statestore.RunCancelled, "")} {
		if _, err := n.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	return wf
}

func startWorkflow(t *testing.T, c *adapter.Client) string {
	t.Helper()
	ctx := context.Background()
	name := "nodetest_retention_" + strings.ReplaceAll(filepath.Base(t.TempDir()), "-", "_")
	if err := c.RegisterTaskDefs(ctx, []model.TaskDef{{Name: name, OwnerEmail: "sidecar-tests@example.com", TimeoutSeconds: 120, ResponseTimeoutSeconds: 60, TimeoutPolicy: "TIME_OUT_WF"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterWorkflowDef(ctx, model.WorkflowDef{Name: name, Version: 1, OwnerEmail: "sidecar-tests@example.com", SchemaVersion: 2,
		Tasks: []model.WorkflowTask{{Name: name, TaskReferenceName: "s1", Type_: "SIMPLE"}}}); err != nil {
		t.Fatal(err)
	}
	id, err := c.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Terminate(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestNode_RetentionConductor: a node with retention on PostgreSQL (the
// retention role's URL, --retention-store) removes a finished run from the
// log and, by default, its workflow from Conductor; with Conductor off the
// workflow stays. Without --retention-store the node refuses to open.
func TestNode_RetentionConductor(t *testing.T) {
	for _, removeWorkflow := range []bool{true, false} {
		t.Run(fmt.Sprintf("conductor=%v", removeWorkflow), func(t *testing.T) {
			ctx := context.Background()
			roles := pgtest.NewRoles(t)
			if _, err := pgstore.Migrate(ctx, roles.OwnerURL, pgstore.MigrateOptions{RuntimeRole: roles.Runtime, RetentionRole: roles.Retention}); err != nil {
				t.Fatal(err)
			}
			_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", Permissions: natsstore.AllPermissions})
			cfg := testConfig(t, srv.URL())
			cfg.Postgres = roles.RuntimeURL
			dir := filepath.Join(t.TempDir(), "archive")
			cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + dir, Conductor: removeWorkflow}
			if removeWorkflow { // without the retention role's URL: refused
				if err := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry()).Open(ctx); err == nil || !strings.Contains(err.Error(), "--retention-store") {
					t.Fatalf("open without --retention-store: %v, want refused naming it", err)
				}
			}
			cfg.Retention.Store = roles.RetentionURL
			reg := prometheus.NewRegistry()
			n := New(cfg, zaptest.NewLogger(t), reg)
			if err := n.Open(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = n.Close(ctx) })
			wf := cancelledRunOfWorkflow(t, n, "node-done")
			deadline := time.Now().Add(20 * time.Second)
			for {
				recs, err := n.store.Fetch(ctx, "node-done", 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the finished run was not removed within 20 s")
				}
				time.Sleep(50 * time.Millisecond)
			}
			_, err := n.conductor.Workflow(ctx, wf, false)
			if removeWorkflow && !errors.Is(err, adapter.ErrNotFound) {
				t.Fatalf("the removed run's workflow in Conductor: %v, want NOT_FOUND", err)
			}
			if !removeWorkflow {
				if err != nil {
					t.Fatalf("with Conductor off, the workflow: %v, want kept", err)
				}
				_ = n.conductor.RemoveWorkflow(ctx, wf)
			}
			rep, err := archive.Verify(ctx, archive.NewDir(dir), archive.VerifyOptions{})
			if err != nil || len(rep.Problems) != 0 || rep.Runs != 1 || rep.Records != 2 {
				t.Fatalf("archive: %+v %v", rep, err)
			}
			// The log's size is exported on PostgreSQL too.
			if got, err := testutil.GatherAndCount(reg, "sidecar_log_bytes", "sidecar_log_records", "sidecar_log_last_sequence"); err != nil || got != 3 {
				t.Fatalf("log size metrics on PostgreSQL: %d series, %v", got, err)
			}
		})
	}
}

// TestNode_RetentionArchiveUnreadableAtStart: serve starts while its
// archive cannot be read (it keeps the runs until it can), and says so at
// once, naming the flag to check, not only at the first due run.
func TestNode_RetentionArchiveUnreadableAtStart(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Retention = Retention{Finished: time.Hour, Interval: time.Hour, Archive: "file://" + filepath.Join(notADir, "archive"),
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	core, logs := observer.New(zap.WarnLevel)
	n := New(cfg, zap.New(core), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatalf("serve refused to start with its archive unreadable: %v", err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "the archive cannot be read now") && strings.Contains(e.Message, "--archive") {
			return
		}
	}
	t.Fatalf("no warning about the unreadable archive at start; warnings: %v", logs.All())
}

// TestNode_RetentionKeepsTheListedRunWhileConductorRefuses: a finished run
// whose workflow Conductor does not remove (its store stalls) stays in hot
// state, and so in the run list: the list's row leaves only with the run,
// after Conductor's copy (docs/retention.md, "What a removal does").
func TestNode_RetentionKeepsTheListedRunWhileConductorRefuses(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	// Conductor's removal of a workflow fails: a front that answers it 500
	// and passes everything else to the test Conductor.
	target, err := url.Parse(cfg.ConductorURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := conductortest.ReverseProxy(t, target)
	var refused atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/remove") {
			refused.Add(1)
			http.Error(w, `{"status":500,"message":"HikariPool-1 - Connection is not available"}`, http.StatusInternalServerError)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	cfg.ConductorURL = front.URL + target.Path
	dir := filepath.Join(t.TempDir(), "archive")
	cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + dir, Conductor: true,
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	cancelledRunOfWorkflow(t, n, "node-done")
	// Archived, Conductor's removal refused.
	for deadline := time.Now().Add(20 * time.Second); refused.Load() < 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Conductor was asked to remove the workflow %d times in 20 s", refused.Load())
		}
	}
	if recs, err := n.store.Fetch(ctx, "node-done", 0, 0); err != nil || len(recs) != 2 {
		t.Fatalf("the run in the log: %d records, %v; want it whole", len(recs), err)
	}
	if _, err := n.list.WaitIndexed(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := n.list.List(runlist.Filter{}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Runs) != 1 || page.Runs[0].RunID != "node-done" {
		t.Fatalf("the run list while the run is still in hot state: %+v, want node-done", page.Runs)
	}
}

// TestNode_ArchivedReadsWaitForTheArchiveAfterARestart: a node restarted
// with its archive's directory empty (the volume not mounted yet) answers
// a read of a run that left hot state 503 ARCHIVE_UNAVAILABLE, not 404:
// hot state noted the archive's head, and the archive there is not it.
// With the volume back, the run reads again.
func TestNode_ArchivedReadsWaitForTheArchiveAfterARestart(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	dir := filepath.Join(t.TempDir(), "archive")
	retain := Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + dir,
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	start := func() (*Node, string) {
		t.Helper()
		cfg := testConfig(t, srv.URL())
		cfg.Retention = retain
		n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
		if err := n.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return n, "http://" + cfg.API.Addr().String()
	}
	n, _ := start()
	for _, w := range []*statestore.RunEventWrite{storetest.Event("left", statestore.RunStarted, ""), storetest.Event("left", statestore.RunCompleted, "")} {
		if _, err := n.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if recs, err := n.store.Fetch(ctx, "left", 0, 0); err == nil && len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the finished run was not removed within 20 s")
		}
	}
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o750); err != nil { // the bare mount point
		t.Fatal(err)
	}
	n2, api := start()
	t.Cleanup(func() { _ = n2.Close(ctx) })
	status := func() (int, string) {
		t.Helper()
		resp, err := http.Get(api + "/v1/runs/left")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Code
	}
	if code, c := status(); code != http.StatusServiceUnavailable || c != "ARCHIVE_UNAVAILABLE" {
		t.Fatalf("a run that left, the archive's volume not there: %d %s, want 503 ARCHIVE_UNAVAILABLE", code, c)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	if code, c := status(); code != http.StatusOK {
		t.Fatalf("the run with the archive back: %d %s, want 200", code, c)
	}
}
