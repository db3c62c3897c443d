package eventbus_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestWebhookSink_ErrorsDoNotShowTheURLsSecrets: a sink's URL may carry a
// credential (a token in the query or the path, as Slack's hooks do, a
// user and password): a failed delivery's error, which is logged and kept
// in the dead letter every viewer in scope reads, names the URL's scheme
// and host alone. Before, the transport's error carried the whole URL but
// the password, and a redirect's line the whole URL and Location.
func TestWebhookSink_ErrorsDoNotShowTheURLsSecrets(t *testing.T) {
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://elsewhere.example/x?token=LOCATIONSECRET", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	for _, base := range []string{redirect.URL, down.URL} {
		u := strings.Replace(base, "http://", "http://user:PASSWORDSECRET@", 1) + "/services/PATHSECRET?token=QUERYSECRET"
		s, err := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: "hook", URL: u, Secret: []byte("0123456789abcdef")})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Deliver(context.Background(), []eventbus.Message{{ID: "e1", Type: "RunStarted", RunID: "r1", Body: []byte(`{}`)}})
		if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), base+"/…") {
			t.Fatalf("%s: %v; want an error naming the URL's scheme and host, without its secrets", base, err)
		}
	}
}
