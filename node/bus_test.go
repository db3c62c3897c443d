package node

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// A webhook whose host does not resolve at start (its consumer's Service
// not created yet, its DNS away) does not stop serve: it is said once,
// and the sink retries. Before, serve exited 1.
func TestBus_UnresolvedWebhookHostIsNotFatal(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	b := Bus{Sinks: []Sink{{Webhook: &eventbus.WebhookSinkConfig{Name: "late", URL: "http://hooks-not-created-yet.invalid/h",
		Secret: []byte("0123456789abcdef")}}}}
	if err := b.checkNotSelf(context.Background(), []string{"127.0.0.1:8787"}, zap.New(core)); err != nil {
		t.Fatalf("a webhook host that does not resolve: %v, want serve to start", err)
	}
	if logs.FilterMessageSnippet("does not resolve").Len() != 1 {
		t.Fatalf("logged %v, want one warning naming the sink", logs.All())
	}
}

// A webhook whose host resolves to the sidecar's own API only when it is
// dialled (here a name, localhost, whose check at start was passed over)
// is refused at every connection: nothing reaches the API. A consumer on
// another local address or port is reached as before.
func TestBus_WebhookToItselfRefusedWhenDialled(t *testing.T) {
	var reached, consumed atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Add(1) }))
	t.Cleanup(api.Close)
	consumer := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { consumed.Add(1) }))
	t.Cleanup(consumer.Close)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(api.URL, "http://"))
	b := Bus{Sinks: []Sink{
		{Webhook: &eventbus.WebhookSinkConfig{Name: "self", URL: "http://localhost:" + port + "/h", Secret: []byte("0123456789abcdef")}},
		{Webhook: &eventbus.WebhookSinkConfig{Name: "consumer", URL: consumer.URL + "/h", Secret: []byte("0123456789abcdef")}}}}
	sinks, err := b.open(context.Background(), nil, 1, []string{api.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	msg := []eventbus.Message{{ID: "e1", Type: "RunStarted", RunID: "r1", Body: []byte(`{}`)}}
	_, err = sinks[0].Deliver(context.Background(), msg)
	var de *exec.DestinationError
	if !errors.As(err, &de) || reached.Load() != 0 {
		t.Fatalf("a delivery to the sidecar's own API: %v, %d requests reached it; want a DestinationError and none", err, reached.Load())
	}
	if n, err := sinks[1].Deliver(context.Background(), msg); err != nil || n != 1 || consumed.Load() != 1 {
		t.Fatalf("a delivery to a consumer on 127.0.0.1: %d, %v (%d received), want delivered", n, err, consumed.Load())
	}
}
