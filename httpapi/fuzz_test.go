package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// fuzzListedHandler is the API over a real log, run list and event bus
// (embedded NATS) with a recording Control: runs run-1 (RUNNING, labels
// team=data) and run-2 (PAUSED), and their events dead-lettered by a
// webhook that refuses everything.
func fuzzListedHandler(f *testing.F) (http.Handler, *recordingControl) {
	ctx := context.Background()
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadRequest) }))
	f.Cleanup(refuse.Close)
	js, _ := natstest.Start(f)
	store, list := openListedLog(f, js)
	hook, err := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: "hook", URL: refuse.URL, Secret: []byte("fuzz-test-signing-secret")})
	if err != nil {
		f.Fatal(err)
	}
	bus, err := eventbus.Open(ctx, js, eventbus.Options{Log: store, Sinks: []eventbus.Sink{hook}, Timeout: 500 * time.Millisecond, Logger: zap.NewNop()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = bus.Close(context.Background()) })
	run1 := storetest.Event("run-1", statestore.RunStarted, "")
	storetest.WithPayload(run1, map[string]any{"labels": map[string]string{"team": "data"}})
	for _, w := range []*statestore.RunEventWrite{run1, storetest.Event("run-2", statestore.RunStarted, ""), storetest.Event("run-2", statestore.RunPaused, "")} {
		if _, err := store.Append(ctx, w); err != nil {
			f.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		f.Fatal(err)
	}
	if err := waitDeadLetters(ctx, bus, 3); err != nil {
		f.Fatal(err)
	}
	rc := &recordingControl{}
	return httpapi.NewServer(httpapi.Options{Log: store, List: list, Bus: bus, Control: rc}).Handler(), rc
}

// FuzzListQuery feeds GET /v1/runs queries (filters, selectors, limits,
// continue tokens, watches) through the real handler: never a panic or a
// 500, and a 4xx is one of the API's machine codes.
func FuzzListQuery(f *testing.F) {
	for _, seed := range []string{
		"", "labelSelector=team%3Ddata", "labelSelector=tier+in+(gold", "labelSelector=" + strings.Repeat("k%3Dv%2C", 30) + "k%3Dv",
		"labelSelector=team+in+(" + strings.Repeat("a%2C", 600) + "b)", "status=RUNNING,PAUSED&substatus=DRAINING", "status=nope",
		"limit=0", "limit=99999999999999999999", "continue=eyJjIjoxLCJyIjoicnVuLTEifQ", "continue=%%%", "continue=" + strings.Repeat("A", 5000),
		"tenantId=" + strings.Repeat("x", 300), "planId=a%00b", "planVersion=%FF", "watch=true&timeoutSeconds=0", "watch=true&revision=-1",
	} {
		f.Add(seed)
	}
	h, _ := fuzzListedHandler(f)
	if w := serveFuzz(h, "GET", "/v1/runs?labelSelector=team%3Ddata", ""); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "run-1") {
		f.Fatalf("a good listing: %d %s, want run-1", w.Code, w.Body)
	}
	f.Fuzz(func(t *testing.T, query string) {
		if strings.Contains(query, "watch") {
			q, _ := url.ParseQuery(query)
			if q.Get("timeoutSeconds") != "0" {
				return // a watch waits up to 60 s by design
			}
		}
		checkFuzzAnswer(t, serveFuzz(h, "GET", "/v1/runs?"+query, ""), query)
	})
}

// FuzzBulkBody feeds bulk action bodies through the real handler: never a
// panic or a 500, and a refused body reaches no control call.
func FuzzBulkBody(f *testing.F) {
	for _, seed := range []string{
		`{"all":true,"reason":"r","dryRun":true}`, `{"labelSelector":"team=data","reason":"r"}`, `{"labelSelector":"team=data"}`, `{}`,
		`{"all":true,"reason":"` + strings.Repeat("r", httpapi.MaxReasonBytes+1) + `"}`, `{"all":true,"reason":"\ud800"}`,
		`{"planId":"` + strings.Repeat("p", 300) + `","reason":"r"}`, `{"labelSelector":"` + strings.Repeat("k=v,", 30) + `k=v","reason":"r"}`,
		`{"all":true,"reason":"r","maxPerSecond":-1}`, `{"all":true,"reason":"r","batch":2,"intervalSeconds":0}`,
		`{"all":true,"reason":"r","timeoutSeconds":9223372036854775807}`, `{"all":true,"reason":"r","resumeAt":"tomorrow"}`,
		`{"all":"yes","reason":"r"}`, `{"all":true,"reason":"r"} {}`,
	} {
		f.Add("pause", seed)
		f.Add("resume", seed)
		f.Add("cancel", seed)
	}
	h, rc := fuzzListedHandler(f)
	if w := serveFuzz(h, "POST", "/v1/runs:cancel", `{"labelSelector":"team=data","reason":"r"}`); w.Code != http.StatusOK || len(rc.taken()) != 1 {
		f.Fatalf("a good bulk cancel: %d %s, control %v, want 200 and one cancel", w.Code, w.Body, rc.taken())
	}
	f.Fuzz(func(t *testing.T, action, body string) {
		if action != "pause" && action != "resume" && action != "cancel" {
			return
		}
		before := len(rc.taken())
		w := serveFuzz(h, "POST", "/v1/runs:"+action, body)
		checkFuzzAnswer(t, w, body)
		if w.Code >= 400 && len(rc.taken()) != before {
			t.Fatalf("refused body %q (%d) reached the control", body, w.Code)
		}
	})
}

// FuzzBusRoutes feeds GET /v1/bus/deadletters queries and replay bodies
// through the real handler: never a panic or a 500, and a 4xx is one of
// the API's machine codes.
func FuzzBusRoutes(f *testing.F) {
	for _, seed := range []string{"", "sink=hook&limit=2", "limit=0", "limit=abc", "sink=nope", "after=" + strings.Repeat("x", 300), "sink=a%00b", "after=%FF"} {
		f.Add("list", seed)
	}
	for _, seed := range []string{`{"sink":"hook"}`, `{"keys":["x"]}`, `{"sink":"nope"}`, `{"sink":"hook","keys":["hook.00000000000000000001.x"]}`,
		`{"sink":"hook","keys":["` + strings.Repeat("k", 300) + `"]}`, `{"sink":"hook","keys":[1]}`, `{"sink":"\udc00"}`, `{"sink":"hook","keys":null}`} {
		f.Add("replay", seed)
	}
	h, _ := fuzzListedHandler(f)
	if w := serveFuzz(h, "GET", "/v1/bus/deadletters?sink=hook", ""); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "run-1") {
		f.Fatalf("a good listing: %d %s, want the dead letters of run-1", w.Code, w.Body)
	}
	f.Fuzz(func(t *testing.T, route, input string) {
		switch route {
		case "list":
			checkFuzzAnswer(t, serveFuzz(h, "GET", "/v1/bus/deadletters?"+input, ""), input)
		case "replay":
			checkFuzzAnswer(t, serveFuzz(h, "POST", "/v1/bus/deadletters:replay", input), input)
		}
	})
}
