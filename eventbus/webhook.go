package eventbus

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/conductor-sidecar/sidecar/vocab"
)

// WebhookSink POSTs each event, one per request, to a URL, signed the
// Standard Webhooks way (https://www.standardwebhooks.com): headers
// webhook-id (the event's id: the consumer's dedup key, the same on every
// redelivery), webhook-timestamp (Unix seconds) and webhook-signature
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" with the shared secret.
// A 2xx answer acknowledges the event; a 408, 429 or 5xx, a redirect
// (never followed), a timeout or a refused connection is retried; any
// other 4xx rejects it for good (dead-lettered at once).
type WebhookSink struct {
	name, vocabulary, url string
	// shown is url as errors name it (shownURL): without what may carry
	// a credential.
	shown  string
	secret []byte
	client *http.Client
	now    func() time.Time
}

// WebhookSinkConfig configures a WebhookSink.
type WebhookSinkConfig struct {
	Name, Vocabulary string
	// URL is where events are POSTed (http or https).
	URL string
	// Secret is the HMAC key (at least 16 bytes).
	Secret []byte
	// Timeout bounds one request (default 10s).
	Timeout time.Duration
	// Client is the HTTP client (default: one with Timeout; one without a
	// timeout of its own gets Timeout); the sink uses a copy that does not
	// follow redirects.
	Client *http.Client
}

// MinSecretBytes is the shortest signing secret a webhook sink takes.
const MinSecretBytes = 16

// NewWebhookSink checks cfg and returns the sink.
func NewWebhookSink(cfg WebhookSinkConfig) (*WebhookSink, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink %s: url= is not an http(s) URL with a host", cfg.Name)}
	}
	if len(cfg.Secret) < MinSecretBytes {
		return nil, &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink %s: the signing secret is %d bytes, at least %d are needed (secret-file=)", cfg.Name, len(cfg.Secret), MinSecretBytes)}
	}
	if cfg.Vocabulary == "" {
		cfg.Vocabulary = vocab.Sidecar
	}
	if _, err := vocab.Views(cfg.Vocabulary, nil); err != nil {
		return nil, &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink %s: vocabulary %q", cfg.Name, cfg.Vocabulary), Err: err}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	client := &http.Client{Timeout: cfg.Timeout}
	if cfg.Client != nil {
		c := *cfg.Client
		if c.Timeout <= 0 {
			c.Timeout = cfg.Timeout
		}
		client = &c
	}
	// A redirect is not followed: a 302 or 303 would turn the signed POST
	// into an empty GET whose 2xx acknowledged the event, and a 307 or
	// 308 would send the signed body wherever its Location points.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &WebhookSink{name: cfg.Name, vocabulary: cfg.Vocabulary, url: cfg.URL, shown: shownURL(u), secret: cfg.Secret, client: client, now: time.Now}, nil
}

// shownURL is u without what may carry a credential: its user and
// password, path (Slack's and Teams' hooks keep their secret there),
// query and fragment; scheme://host[:port], "/…" marking a path left out.
func shownURL(u *url.URL) string {
	shown := u.Scheme + "://" + u.Host
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		shown += "/…"
	}
	return shown
}

// Name implements Sink.
func (s *WebhookSink) Name() string { return s.name }

// Vocabulary implements Sink.
func (s *WebhookSink) Vocabulary() string { return s.vocabulary }

// Batch implements Batcher: one event per Deliver, so that the cursor
// is saved after every acknowledged request and a crash repeats at most
// the request in flight.
func (s *WebhookSink) Batch() int { return 1 }

// Deliver implements Sink: one request per message, in order, until one
// fails.
func (s *WebhookSink) Deliver(ctx context.Context, msgs []Message) (int, error) {
	for i := range msgs {
		if err := s.post(ctx, &msgs[i]); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

func (s *WebhookSink) post(ctx context.Context, m *Message) error {
	ts := strconv.FormatInt(s.now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(m.Body))
	if err != nil {
		return failed("webhook request", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", m.ID)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", "v1,"+Sign(s.secret, m.ID, ts, m.Body))
	req.Header.Set("Sidecar-Event-Type", m.Type)
	req.Header.Set("Sidecar-Run-Id", m.RunID)
	resp, err := s.client.Do(req)
	if err != nil {
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			ue.URL = s.shown
		}
		return failed("webhook POST", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c >= 300 && c < 400:
		loc := "none"
		if l, err := url.Parse(resp.Header.Get("Location")); err == nil && resp.Header.Get("Location") != "" {
			loc = strconv.Quote(shownURL(l))
		}
		return failed(fmt.Sprintf("webhook answered %s to %s: the sink does not follow redirects; set its url= to the address the consumer takes events at (the answer's Location: %s)", resp.Status, s.shown, loc), nil)
	case verdicts[c]:
		return &Error{Code: CodeRejected, Message: "webhook answered " + resp.Status}
	default:
		return failed("webhook answered "+resp.Status, nil)
	}
}

// verdicts are the answers that refuse the event itself, for good: it is
// dead-lettered at once. Any other 4xx is retried as a 5xx is: it is what
// a consumer's ingress or gateway answers while the consumer is away or
// being changed (a default backend's 404, a 401 or 403 during a key
// rotation), not the consumer's word on the event.
var verdicts = map[int]bool{
	http.StatusBadRequest:            true,
	http.StatusGone:                  true,
	http.StatusRequestEntityTooLarge: true,
	http.StatusUnsupportedMediaType:  true,
	http.StatusUnprocessableEntity:   true,
}

// Sign is the Standard Webhooks signature of an event: base64 of
// HMAC-SHA256(secret, id + "." + timestamp + "." + body).
func Sign(secret []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
