package httpapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// archivedEnv is an API over a removable embedded JetStream log and a
// file:// archive, after a real retention pass removed run "gone" (a
// finished 2-step run, label team=data), "gone-2" (team=web) and "gone-3"
// (two manifests in all) and kept run "hot" (running); then finished run
// "moving" (team=data) was archived twice and is still in hot state.
func archivedEnv(t *testing.T) (srv *httptest.Server, list *runlist.List, goneRecs []statestore.RunEventRecord) {
	t.Helper()
	srv, list, goneRecs, _ = archivedEnvAuth(t, nil)
	return srv, list, goneRecs
}

// archivedEnvAuth is archivedEnv with auth (nil: none), also returning
// the file:// archive's directory.
func archivedEnvAuth(t *testing.T, auth httpapi.Authenticator) (srv *httptest.Server, list *runlist.List, goneRecs []statestore.RunEventRecord, dir string) {
	t.Helper()
	return archivedEnvWith(t, auth, nil)
}

// archivedEnvWith is archivedEnvAuth with the API reading the archive
// through wrap, when set.
func archivedEnvWith(t *testing.T, auth httpapi.Authenticator, wrap func(httpapi.ArchiveReader) httpapi.ArchiveReader) (srv *httptest.Server, list *runlist.List, goneRecs []statestore.RunEventRecord, dir string) {
	t.Helper()
	return archivedEnvOpts(t, auth, wrap, nil)
}

// archivedEnvOpts is archivedEnvWith with the API's options changed by
// opts, when set.
func archivedEnvOpts(t *testing.T, auth httpapi.Authenticator, wrap func(httpapi.ArchiveReader) httpapi.ArchiveReader, opts func(*httpapi.Options)) (srv *httptest.Server, list *runlist.List, goneRecs []statestore.RunEventRecord, dir string) {
	t.Helper()
	ctx := context.Background()
	js, ns := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{
		RetentionPermissions: natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, natsstore.DefaultSnapshotBucket)})
	store, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true, SnapshotBucket: natsstore.DefaultSnapshotBucket, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	emit := registry.NewEmitter(ids, store)
	teams := map[string]string{"gone": "data", "gone-2": "web", "moving": "data"}
	started := func(id string) *statestore.RunEventWrite {
		p := map[string]any{"engineRunRef": statestore.ConductorRunRef("plan", "wf-"+id), "engineType": "conductor"}
		if team := teams[id]; team != "" {
			p["labels"] = map[string]string{"team": team}
		}
		return storetest.WithPayload(storetest.Event(id, statestore.RunStarted, ""), p)
	}
	for _, w := range []*statestore.RunEventWrite{
		started("gone"), storetest.Event("gone", statestore.StepStarted, "a"), storetest.Event("gone", statestore.StepCompleted, "a"),
		storetest.Event("gone", statestore.StepStarted, "b"), storetest.Event("gone", statestore.StepCompleted, "b"),
		storetest.Event("gone", statestore.RunCompleted, ""),
		started("gone-2"), storetest.Event("gone-2", statestore.RunFailed, ""),
		started("gone-3"), storetest.Event("gone-3", statestore.RunCancelled, ""),
		started("hot"),
	} {
		if _, err := emit.Emit(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if goneRecs, err = store.Fetch(ctx, "gone", 0, 0); err != nil || len(goneRecs) != 6 {
		t.Fatalf("gone has %d records (%v), want 6", len(goneRecs), err)
	}
	// Its snapshot is now cached in the projector, as on a replica that
	// served it before it left.
	if snap, err := store.ProjectSnapshot(ctx, "gone"); err != nil || snap.Status != statestore.RunStatusCompleted {
		t.Fatalf("gone before removal: %+v %v", snap, err)
	}
	dir = t.TempDir()
	arch, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ns.ConnectRetention()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := natsstore.OpenRemover(ctx, rjs, natsstore.RemoverOptions{Logger: zaptest.NewLogger(t),
		RunKeys: []natsstore.RunKeys{{Bucket: natsstore.DefaultSnapshotBucket, Keys: natsstore.RunKey}}})
	if err != nil {
		t.Fatal(err)
	}
	// Two runs a segment: the three finished runs make two manifests.
	r, err := retention.New(store, arch, rm, retention.Options{RetainFinished: time.Minute, BatchRuns: 2, Logger: zaptest.NewLogger(t),
		Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(ctx) })
	if res, err := r.Pass(ctx); err != nil || res.Removed != 3 {
		t.Fatalf("retention pass: %+v %v, want 3 runs removed", res, err)
	}
	if h := arch.Head(); h == nil || h.Seq != 2 {
		t.Fatalf("archive head %+v, want manifest 2", h)
	}
	if recs, err := store.Fetch(ctx, "gone", 0, 0); err != nil || len(recs) != 0 {
		t.Fatalf("gone after removal: %d records, %v", len(recs), err)
	}
	// Run "moving" finished and was archived twice (as a pass that
	// stopped before its removal leaves it, and the next pass), and is
	// still in hot state.
	for _, w := range []*statestore.RunEventWrite{started("moving"), storetest.Event("moving", statestore.RunCompleted, "")} {
		if _, err := emit.Emit(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	moving, err := store.Fetch(ctx, "moving", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := arch.Write(ctx, []archive.Run{{ID: "moving", Records: moving}}); err != nil {
			t.Fatal(err)
		}
	}
	ctrl := drain.New(store, emit, &pausedWorkflows{}, drain.Options{})
	list, err = runlist.Open(ctx, js, runlist.Options{Log: store, Poll: 10 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = list.Close(ctx) })
	if _, err := list.WaitIndexed(ctx); err != nil {
		t.Fatal(err)
	}
	var reader httpapi.ArchiveReader = arch
	if wrap != nil {
		reader = wrap(arch)
	}
	o := httpapi.Options{Log: store, Archive: reader, Control: ctrl, List: list, Auth: auth, Plans: scriptedPlans{}, Logger: zaptest.NewLogger(t)}
	if opts != nil {
		opts(&o)
	}
	srv = httptest.NewServer(httpapi.NewServer(o).Handler())
	t.Cleanup(srv.Close)
	return srv, list, goneRecs, dir
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %d %s: %v", url, resp.StatusCode, b, err)
	}
	return resp.StatusCode
}

// TestServer_ArchivedRun: a run a retention pass removed answers status
// and events from the archive as a hot run would, marked archived; a hot
// run is not marked; control actions on the archived run answer
// RUN_ARCHIVED; an unknown run is still RUN_NOT_FOUND.
func TestServer_ArchivedRun(t *testing.T) {
	srv, _, recs := archivedEnv(t)
	t.Run("Status", func(t *testing.T) {
		var v httpapi.RunView
		if code := getJSON(t, srv.URL+"/v1/runs/gone", &v); code != http.StatusOK {
			t.Fatalf("status: %d", code)
		}
		if !v.Archived || v.Status != statestore.RunStatusCompleted || v.LastEventSeq != recs[len(recs)-1].RunSeq || len(v.Steps) != 2 {
			t.Fatalf("status %+v archived %v, want COMPLETED, archived, 2 steps, lastEventSeq %d", v.RunSnapshot, v.Archived, recs[len(recs)-1].RunSeq)
		}
		var hot httpapi.RunView
		if code := getJSON(t, srv.URL+"/v1/runs/hot", &hot); code != http.StatusOK || hot.Archived || hot.Status != statestore.RunStatusRunning {
			t.Fatalf("hot run: %d %+v archived %v", code, hot.RunSnapshot, hot.Archived)
		}
	})
	t.Run("Plan", func(t *testing.T) {
		// The step graph the console draws, for a run read from the
		// archive as for a hot one.
		// (gone-2: a run this process never read before it left.)
		var g httpapi.PlanGraph
		if code := getJSON(t, srv.URL+"/v1/runs/gone-2/plan", &g); code != http.StatusOK || g.PlanID != recs[0].PlanID || len(g.Steps) == 0 {
			t.Fatalf("plan of an archived run: %d %+v, want 200 with plan %s", code, g, recs[0].PlanID)
		}
	})
	t.Run("Events", func(t *testing.T) {
		var all []statestore.RunEventRecord
		after := int64(0)
		for range 10 {
			var p httpapi.EventsPage
			if code := getJSON(t, srv.URL+"/v1/runs/gone/events?limit=4&afterSeq="+itoa(after), &p); code != http.StatusOK || !p.Archived {
				t.Fatalf("events after %d: %d archived %v", after, code, p.Archived)
			}
			if len(p.Events) == 0 {
				break
			}
			all = append(all, p.Events...)
			after = p.NextAfterSeq
		}
		if len(all) != len(recs) {
			t.Fatalf("archived events: %d, want %d", len(all), len(recs))
		}
		for i := range recs {
			if all[i].EventID != recs[i].EventID || all[i].RunSeq != recs[i].RunSeq || all[i].PersistedAt != recs[i].PersistedAt {
				t.Fatalf("event %d: %+v, want %+v", i, all[i], recs[i])
			}
		}
	})
	t.Run("ControlIsRunArchived", func(t *testing.T) {
		for _, action := range []string{"pause", "resume", "cancel", "steps/a/retry"} {
			resp, err := http.Post(srv.URL+"/v1/runs/gone/"+action, "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			var a answer
			_ = json.NewDecoder(resp.Body).Decode(&a)
			resp.Body.Close()
			if resp.StatusCode != http.StatusConflict || a.Code != httpapi.CodeRunArchived {
				t.Fatalf("%s of the archived run: %d %s, want 409 %s", action, resp.StatusCode, a.Code, httpapi.CodeRunArchived)
			}
		}
	})
	t.Run("ListIncludeArchived", func(t *testing.T) {
		// Page by one: the hot run(s), then the archived ones, each once,
		// across both manifests, marked.
		want := map[string]string{"gone": statestore.RunStatusCompleted, "gone-2": statestore.RunStatusFailed, "gone-3": statestore.RunStatusCancelled}
		seen := map[string]bool{}
		archived := map[string]int{}
		cont := ""
		for range 20 {
			var l httpapi.RunList
			if code := getJSON(t, srv.URL+"/v1/runs?include=archived&limit=1&continue="+url.QueryEscape(cont), &l); code != http.StatusOK {
				t.Fatalf("list: %d", code)
			}
			for _, r := range l.Runs {
				seen[r.RunID] = true
				if r.Archived {
					archived[r.RunID]++
					if r.Status != want[r.RunID] || r.CreatedAt == "" || r.CompletedAt == "" {
						t.Fatalf("archived row %+v, want status %s", r.Row, want[r.RunID])
					}
				}
			}
			if cont = l.Continue; cont == "" {
				break
			}
		}
		if !seen["hot"] || len(archived) != 3 || archived["gone"] != 1 || archived["gone-2"] != 1 || archived["gone-3"] != 1 {
			t.Fatalf("listed %v, archived %v: want hot, and each archived run once", seen, archived)
		}
		var l httpapi.RunList
		getJSON(t, srv.URL+"/v1/runs?include=archived&status=RUNNING", &l)
		for _, r := range l.Runs {
			if r.Archived {
				t.Fatalf("status=RUNNING listed archived run %+v", r.Row)
			}
		}
		var a answer
		if code := getJSON(t, srv.URL+"/v1/runs?include=everything", &a); code != http.StatusBadRequest || a.Code != httpapi.CodeBadRequest {
			t.Fatalf("include=everything: %d %s, want 400", code, a.Code)
		}
	})
	t.Run("UnknownRun", func(t *testing.T) {
		for _, path := range []string{"/v1/runs/never", "/v1/runs/never/events"} {
			var a answer
			if code := getJSON(t, srv.URL+path, &a); code != http.StatusNotFound || a.Code != httpapi.CodeRunNotFound {
				t.Fatalf("GET %s: %d %s, want 404 %s", path, code, a.Code, httpapi.CodeRunNotFound)
			}
		}
	})
}

// TestServer_ArchivedListLabelsAndOnce: with include=archived, an
// archived run carries its labels (a label selector finds it), and a run
// that is both in hot state and archived (twice) is listed once, from hot
// state.
func TestServer_ArchivedListLabelsAndOnce(t *testing.T) {
	srv, list, _ := archivedEnv(t)
	listAll := func(query string) []httpapi.ListedRun {
		t.Helper()
		var all []httpapi.ListedRun
		cont := ""
		for range 50 {
			var l httpapi.RunList
			if code := getJSON(t, srv.URL+"/v1/runs?include=archived&limit=1&"+query+"&continue="+url.QueryEscape(cont), &l); code != http.StatusOK {
				t.Fatalf("list %s: %d", query, code)
			}
			all = append(all, l.Runs...)
			if cont = l.Continue; cont == "" {
				return all
			}
		}
		t.Fatalf("list %s: more than 50 pages", query)
		return nil
	}
	got := map[string][]bool{} // runId -> archived flag of each listing
	for _, r := range listAll("labelSelector=team%3Ddata") {
		got[r.RunID] = append(got[r.RunID], r.Archived)
		if r.Labels["team"] != "data" {
			t.Fatalf("team=data listed %s with labels %v", r.RunID, r.Labels)
		}
	}
	if len(got) != 2 || len(got["gone"]) != 1 || !got["gone"][0] || len(got["moving"]) != 1 || got["moving"][0] {
		t.Fatalf("team=data listed %v (runId: archived flags); want gone once archived, moving once from hot state", got)
	}
	n := 0
	for _, r := range listAll("") {
		if r.RunID == "moving" {
			n++
			if r.Archived {
				t.Fatalf("moving listed from the archive while in hot state: %+v", r)
			}
		}
	}
	if n != 1 {
		t.Fatalf("moving listed %d times, want once", n)
	}

	// Its row leaves the run list (the last step of its removal): it is
	// listed once, from its newest archived copy.
	ctx := context.Background()
	if err := list.ForgetRun(ctx, "moving"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		hot, err := list.HasRow(ctx, "moving")
		if err != nil {
			t.Fatal(err)
		}
		if !hot {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run list still has moving's row a minute after ForgetRun")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var flags []bool
	for _, r := range listAll("") {
		if r.RunID == "moving" {
			flags = append(flags, r.Archived)
		}
	}
	if len(flags) != 1 || !flags[0] {
		t.Fatalf("moving, archived twice and out of hot state, listed with archived flags %v; want once, archived", flags)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestServer_ArchivedRunCorrupt: a run whose archived segment no longer
// matches its manifest is refused with ARCHIVE_CORRUPT (500), not
// INTERNAL, to whom may read it; to a principal scoped to another tenant it
// is RUN_NOT_FOUND, as a run that does not exist: its scope is decided
// from the manifest's entry, not from the records that cannot be read,
// and nothing of the archive's names or hashes reaches that principal.
func TestServer_ArchivedRunCorrupt(t *testing.T) {
	creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(
		principal("owner", "tok-owner", "viewer", "tenantId: tenant_acme"),
		principal("other", "tok-other", "viewer", "tenantId: other"),
		principal("root", "tok-admin", "admin", ""),
	)))
	if err != nil {
		t.Fatal(err)
	}
	srv, _, _, dir := archivedEnvAuth(t, creds)
	segs, err := filepath.Glob(filepath.Join(dir, "segments", "*"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments %v %v", segs, err)
	}
	for _, seg := range segs { // every segment: "gone" is in one of them
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x40
		if err := os.WriteFile(seg, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	get := func(token, path string) (int, answer, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var a answer
		_ = json.Unmarshal(b, &a)
		return resp.StatusCode, a, string(b)
	}
	for _, path := range []string{"/v1/runs/gone", "/v1/runs/gone/events"} {
		for _, tok := range []string{"tok-owner", "tok-admin"} {
			if code, a, body := get(tok, path); code != http.StatusInternalServerError || a.Code != archive.CodeCorrupt {
				t.Errorf("%s as %s: %d %s, want 500 %s", path, tok, code, body, archive.CodeCorrupt)
			}
		}
		code, a, body := get("tok-other", path)
		if code != http.StatusNotFound || a.Code != httpapi.CodeRunNotFound || strings.Contains(body, "segment") {
			t.Errorf("%s as another tenant: %d %s, want 404 %s as for a run that does not exist", path, code, body, httpapi.CodeRunNotFound)
		}
	}
}

// downArchive is the archive as the API reads it while its destination is
// down (an S3 outage): listing its manifests fails as archive.S3 fails
// then, every other read passes.
type downArchive struct {
	httpapi.ArchiveReader
	down bool
}

func (d *downArchive) ManifestSeqs(ctx context.Context) ([]uint64, error) {
	if d.down {
		return nil, &archive.Error{Code: archive.CodeUnavailable, Message: "list manifests/: connection refused"}
	}
	return d.ArchiveReader.ManifestSeqs(ctx)
}

// TestServer_ArchivedListWhileTheArchiveIsDown: with include=archived and
// the archive down, the runs in hot state are still listed, with a
// continue token at the start of the archived part; that page answers
// ARCHIVE_UNAVAILABLE (503) until the archive is back, and then the
// archived runs.
func TestServer_ArchivedListWhileTheArchiveIsDown(t *testing.T) {
	down := &downArchive{}
	srv, _, _, _ := archivedEnvWith(t, nil, func(r httpapi.ArchiveReader) httpapi.ArchiveReader {
		down.ArchiveReader = r
		return down
	})
	down.down = true
	var l httpapi.RunList
	if code := getJSON(t, srv.URL+"/v1/runs?include=archived&limit=50", &l); code != http.StatusOK {
		t.Fatalf("list with the archive down: %d, want the hot runs", code)
	}
	hot := map[string]bool{}
	for _, r := range l.Runs {
		if r.Archived {
			t.Fatalf("an archived run listed while the archive is down: %+v", r.Row)
		}
		hot[r.RunID] = true
	}
	if !hot["hot"] || l.Continue == "" {
		t.Fatalf("listed %v, continue %q: want the hot runs and a continue token for the archived part", hot, l.Continue)
	}
	var a answer
	if code := getJSON(t, srv.URL+"/v1/runs?include=archived&limit=50&continue="+url.QueryEscape(l.Continue), &a); code != http.StatusServiceUnavailable || a.Code != archive.CodeUnavailable {
		t.Fatalf("the archived part while down: %d %s, want 503 %s", code, a.Code, archive.CodeUnavailable)
	}
	down.down = false
	var rest httpapi.RunList
	if code := getJSON(t, srv.URL+"/v1/runs?include=archived&limit=50&continue="+url.QueryEscape(l.Continue), &rest); code != http.StatusOK || len(rest.Runs) != 3 {
		t.Fatalf("the archived part once back: %d, %d runs, want the 3 archived", code, len(rest.Runs))
	}
}

// TestArchived_NotAdoptedWhileConductorIsAway: with adoption on and
// Conductor not answering, a request for an archived run whose id is a
// UUID (as an adopted run's is) is answered from the archive; only an id
// neither hot state nor the archive has needs Conductor, and answers 503
// ENGINE_UNAVAILABLE.
func TestArchived_NotAdoptedWhileConductorIsAway(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	emit := registry.NewEmitter(ids, store)
	// An archived run: written to the archive, never in this log.
	const gone = "8d2f3c1a-5b6e-4f70-9a81-2c3d4e5f6a7b"
	var recs []statestore.RunEventRecord
	for i, w := range []*statestore.RunEventWrite{storetest.Event(gone, statestore.RunStarted, ""), storetest.Event(gone, statestore.RunCompleted, "")} {
		recs = append(recs, statestore.RunEventRecord{RunEventWrite: *w, RunSeq: int64(i + 1), PersistedAt: time.Now().UTC().Format(time.RFC3339Nano)})
	}
	arch, err := archive.Open(ctx, archive.NewDir(t.TempDir()), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := arch.Write(ctx, []archive.Run{{ID: gone, Records: recs}}); err != nil {
		t.Fatal(err)
	}
	// Conductor away: nothing listens there.
	client, err := adapter.NewClient(adapter.ClientOptions{BaseURL: "http://127.0.0.1:1/api", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := adapter.OpenRuns(ctx, js, client, emit, adapter.RunsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	adopter := adapter.NewAdopter(runs, store, adapter.AdopterOptions{Specs: []adapter.AdoptSpec{{Name: "orders"}}, Logger: zaptest.NewLogger(t)})
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, Archive: arch, Adoption: adopter}).Handler())
	defer srv.Close()
	res, err := http.Get(srv.URL + "/v1/runs/" + gone)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(b), `"archived":true`) {
		t.Fatalf("archived run while Conductor is away: %d %s, want 200 from the archive", res.StatusCode, b)
	}
	res, err = http.Get(srv.URL + "/v1/runs/1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "ENGINE_UNAVAILABLE") {
		t.Fatalf("unknown workflow id while Conductor is away: %d %s, want 503 ENGINE_UNAVAILABLE", res.StatusCode, b)
	}
}

// TestServer_ArchivedListPassesOverAnUnreadableManifest: a manifest that
// does not parse, or one missing from the sequence, costs the listing of
// archived runs the runs it lists, not the whole listing (every tenant's):
// the page lists the others and names what it passed over.
func TestServer_ArchivedListPassesOverAnUnreadableManifest(t *testing.T) {
	list := func(t *testing.T, srv string) (names []string, unreadable []httpapi.UnreadableManifest) {
		t.Helper()
		cont := ""
		for range 20 {
			var l httpapi.RunList
			if code := getJSON(t, srv+"/v1/runs?include=archived&limit=1&continue="+url.QueryEscape(cont), &l); code != http.StatusOK {
				t.Fatalf("list: %d", code)
			}
			for _, r := range l.Runs {
				if r.Archived {
					names = append(names, r.RunID)
				}
			}
			unreadable = append(unreadable, l.Unreadable...)
			if cont = l.Continue; cont == "" {
				break
			}
		}
		slices.Sort(names)
		return names, unreadable
	}
	// Manifest 1 holds "gone" and "gone-2", manifest 2 "gone-3" (archivedEnv).
	// The API reads through an Archive opened afresh, as after a restart:
	// it has read no manifest but the newest yet.
	reopened := func(r httpapi.ArchiveReader) httpapi.ArchiveReader {
		a, err := archive.Open(context.Background(), r.(*archive.Archive).Destination(), archive.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	t.Run("DoesNotParse", func(t *testing.T) {
		srv, _, _, dir := archivedEnvWith(t, nil, reopened)
		if err := os.Truncate(filepath.Join(dir, "manifests", "000000000001.json"), 100); err != nil {
			t.Fatal(err)
		}
		names, unreadable := list(t, srv.URL)
		if !slices.Equal(names, []string{"gone-3"}) || !slices.Equal(unreadable, []httpapi.UnreadableManifest{{From: 1, Through: 1, Code: archive.CodeCorrupt}}) {
			t.Fatalf("listed %v, unreadable %+v; want gone-3, and manifest 1 %s", names, unreadable, archive.CodeCorrupt)
		}
	})
	t.Run("RewrittenWithoutKeys", func(t *testing.T) {
		// Manifest 1 rewritten by someone with write access to the
		// archive and no signing key: gone-2 given to another tenant, the
		// manifest's own hash recomputed. Manifest 2's Prev still names
		// the real one: the listing passes over manifest 1 (a scoped
		// caller of the other tenant would have seen gone-2).
		srv, _, _, dir := archivedEnvWith(t, nil, reopened)
		p := filepath.Join(dir, "manifests", "000000000001.json")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var m archive.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for i := range m.Runs {
			if m.Runs[i].RunID == "gone-2" {
				m.Runs[i].TenantID = "tenant_other"
			}
		}
		m.Chain = ""
		c, _ := json.Marshal(&m)
		sum := sha256.Sum256(c)
		m.Chain = hex.EncodeToString(sum[:])
		b, _ = json.Marshal(&m)
		if err := os.WriteFile(p, append(b, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		names, unreadable := list(t, srv.URL)
		if !slices.Equal(names, []string{"gone-3"}) || !slices.Equal(unreadable, []httpapi.UnreadableManifest{{From: 1, Through: 1, Code: archive.ProblemChainBroken}}) {
			t.Fatalf("listed %v, unreadable %+v; want gone-3, and manifest 1 %s", names, unreadable, archive.ProblemChainBroken)
		}
	})
	t.Run("Missing", func(t *testing.T) {
		srv, _, _, dir := archivedEnvWith(t, nil, reopened)
		if err := os.Remove(filepath.Join(dir, "manifests", "000000000002.json")); err != nil {
			t.Fatal(err)
		}
		names, unreadable := list(t, srv.URL)
		if !slices.Equal(names, []string{"gone", "gone-2"}) || !slices.Equal(unreadable, []httpapi.UnreadableManifest{{From: 2, Through: 2, Code: archive.ProblemManifestMissing}}) {
			t.Fatalf("listed %v, unreadable %+v; want gone and gone-2, and manifest 2 missing", names, unreadable)
		}
	})
}

// silentArchive is an archive whose destination accepts requests and
// answers none (archive: TestS3_SilentServerFailsTheCall freezes a real S3
// server; this API test needs the run's other objects in a file:// one):
// each read waits until its context ends, as the S3 destination's does.
type silentArchive struct {
	httpapi.ArchiveReader
	silent atomic.Bool
}

func (s *silentArchive) wait(ctx context.Context) error {
	<-ctx.Done()
	return &archive.Error{Code: archive.CodeUnavailable, Message: "GetObject: " + ctx.Err().Error(), Err: ctx.Err()}
}

func (s *silentArchive) Lookup(ctx context.Context, runID string) (*archive.RunEntry, error) {
	if s.silent.Load() {
		return nil, s.wait(ctx)
	}
	return s.ArchiveReader.Lookup(ctx, runID)
}

func (s *silentArchive) Records(ctx context.Context, runID string) ([]statestore.RunEventRecord, error) {
	if s.silent.Load() {
		return nil, s.wait(ctx)
	}
	return s.ArchiveReader.Records(ctx, runID)
}

func (s *silentArchive) ManifestSeqs(ctx context.Context) ([]uint64, error) {
	if s.silent.Load() {
		return nil, s.wait(ctx)
	}
	return s.ArchiveReader.ManifestSeqs(ctx)
}

// TestServer_ArchivedRunWhileTheArchiveIsSilent: a request that reads an
// archive that does not answer ends with 503 ARCHIVE_UNAVAILABLE once the
// API's bound on archive reads passed, and holds no connection beyond it.
// Before, it waited as long as the archive stayed silent (a status read
// answered after two minutes, when the S3 server woke up).
func TestServer_ArchivedRunWhileTheArchiveIsSilent(t *testing.T) {
	silent := &silentArchive{}
	srv, _, _, _ := archivedEnvOpts(t, nil, func(r httpapi.ArchiveReader) httpapi.ArchiveReader {
		silent.ArchiveReader = r
		return silent
	}, func(o *httpapi.Options) { o.ArchiveReadTimeout = 200 * time.Millisecond })
	silent.silent.Store(true)
	client := &http.Client{Timeout: 30 * time.Second}
	for _, path := range []string{"/v1/runs/gone", "/v1/runs/gone/events"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s while the archive is silent: %v, want an answer", path, err)
		}
		var a answer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || a.Code != archive.CodeUnavailable {
			t.Fatalf("GET %s while the archive is silent: %d %s, want 503 %s", path, resp.StatusCode, a.Code, archive.CodeUnavailable)
		}
	}
}
