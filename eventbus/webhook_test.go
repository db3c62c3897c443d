package eventbus_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/conductor-sidecar/sidecar/eventbus"
)

// TestWebhookSink_RedirectIsNotFollowed: a consumer that answers the
// signed POST with a redirect has not taken the event. Followed, a 302 or
// 303 became an empty GET whose 2xx acknowledged the event (lost for the
// consumer), and a 307 or 308 sent the signed body to whatever address the
// Location named. Now the answer is a failed delivery (retried, then
// dead-lettered), and nothing is sent to the Location.
func TestWebhookSink_RedirectIsNotFollowed(t *testing.T) {
	var elsewhere atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(target.Close)
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target.URL+"/landing", code)
			}))
			t.Cleanup(hook.Close)
			s, err := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: "hook", URL: hook.URL, Secret: []byte("0123456789abcdef")})
			if err != nil {
				t.Fatal(err)
			}
			before := elsewhere.Load()
			n, err := s.Deliver(context.Background(), []eventbus.Message{{ID: "e1", Type: "RunStarted", RunID: "r1", Body: []byte(`{}`)}})
			if n != 0 || !errors.Is(err, eventbus.ErrDeliveryFailed) {
				t.Fatalf("a %d answer: %d delivered, %v; want 0 and EVENT_BUS_DELIVERY_FAILED", code, n, err)
			}
			if got := elsewhere.Load() - before; got != 0 {
				t.Fatalf("a %d answer sent %d requests to its Location", code, got)
			}
		})
	}
}
