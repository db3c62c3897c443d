package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// recordingNudger is a WorkflowNudger that records the workflows it was
// asked to check; it follows the workflows of follows.
type recordingNudger struct {
	follows map[string]bool
	mu      sync.Mutex
	got     []string
}

func (n *recordingNudger) NudgeWorkflow(workflowID string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, workflowID)
	return n.follows[workflowID]
}

func (n *recordingNudger) nudged() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.got...)
}

const testNotifySecret = "a-shared-secret-of-32-characters"

// summary is a notification body as Conductor 3.32's workflow_publisher
// sends it: the workflow's summary, input and output as JSON strings.
func summary(workflowID, status string) string {
	return `{"workflowType":"sidecar_plan_1","version":1,"workflowId":"` + workflowID + `","correlationId":"run-1",` +
		`"startTime":"2026-11-26T19:00:00.000Z","updateTime":"2026-11-26T19:00:01.000Z","status":"` + status + `",` +
		`"input":"{\"runId\":\"run-1\"}","output":"{}","reasonForIncompletion":null,"executionTime":0,"event":"",` +
		`"failedReferenceTaskNames":"","priority":0,"failedTaskNames":[],"createdBy":null,"statusNotifier":null}`
}

func notifyRequest(secret, contentType, body string) *http.Request {
	req := httptest.NewRequest("POST", httpapi.NotifyPath, strings.NewReader(body))
	req.Host = "127.0.0.1:8787"
	if secret != "" {
		req.Header.Set(httpapi.NotifySecretHeader, secret)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req
}

// TestServer_WorkflowStatusNotification: Conductor's notification with the
// shared secret is answered 202 and its workflow checked; without the
// secret, or with a body that is not a notification, it is refused with a
// code and nothing is checked. A bearer token of the API is not the
// secret, and the route needs none.
func TestServer_WorkflowStatusNotification(t *testing.T) {
	dir := t.TempDir()
	creds, err := httpapi.LoadCredentials(writeTokens(t, dir, tokensYAML(principal("root", "tok-admin", "admin", ""))))
	if err != nil {
		t.Fatal(err)
	}
	n := &recordingNudger{follows: map[string]bool{"wf-1": true}}
	h := httpapi.NewServer(httpapi.Options{Auth: creds, Notifications: n, NotifySecret: []byte(testNotifySecret)}).Handler()
	tests := []struct {
		name, secret, contentType, body string
		status                          int
		code                            string
		nudged                          string
	}{
		{"OK", testNotifySecret, "application/json", summary("wf-1", "PAUSED"), 202, "", "wf-1"},
		{"Charset", testNotifySecret, "application/json; charset=UTF-8", summary("wf-1", "RUNNING"), 202, "", "wf-1"},
		{"NotFollowed", testNotifySecret, "application/json", summary("wf-other", "TERMINATED"), 202, "", "wf-other"},
		{"NoSecret", "", "application/json", summary("wf-1", "PAUSED"), 401, "UNAUTHENTICATED", ""},
		{"WrongSecret", testNotifySecret[:31] + "x", "application/json", summary("wf-1", "PAUSED"), 401, "UNAUTHENTICATED", ""},
		{"SecretPrefix", testNotifySecret[:16], "application/json", summary("wf-1", "PAUSED"), 401, "UNAUTHENTICATED", ""},
		{"BearerIsNotTheSecret", "Bearer tok-admin", "application/json", summary("wf-1", "PAUSED"), 401, "UNAUTHENTICATED", ""},
		{"NotJSON", testNotifySecret, "text/plain", summary("wf-1", "PAUSED"), 415, "BAD_REQUEST", ""},
		{"Malformed", testNotifySecret, "application/json", `{"workflowId":"wf-1",`, 400, "BAD_REQUEST", ""},
		{"NoWorkflowID", testNotifySecret, "application/json", `{"status":"PAUSED"}`, 400, "BAD_REQUEST", ""},
		{"EmptyWorkflowID", testNotifySecret, "application/json", summary("", "PAUSED"), 400, "BAD_REQUEST", ""},
		{"UnknownStatus", testNotifySecret, "application/json", summary("wf-1", "RESUMED"), 400, "BAD_REQUEST", ""},
		{"NoStatus", testNotifySecret, "application/json", `{"workflowId":"wf-1"}`, 400, "BAD_REQUEST", ""},
		{"NotAnObject", testNotifySecret, "application/json", `["wf-1"]`, 400, "BAD_REQUEST", ""},
		{"LoneSurrogate", testNotifySecret, "application/json", summary(`wf-\ud800`, "PAUSED"), 400, "BAD_REQUEST", ""},
		{"TooLarge", testNotifySecret, "application/json", `{"workflowId":"wf-1","status":"PAUSED","input":"` + strings.Repeat("x", httpapi.MaxNotificationBytes) + `"}`, 413, "BAD_REQUEST", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(n.nudged())
			w := httptest.NewRecorder()
			h.ServeHTTP(w, notifyRequest(tt.secret, tt.contentType, tt.body))
			var a struct {
				Code       string
				WorkflowID string
				Followed   bool
			}
			_ = json.Unmarshal(w.Body.Bytes(), &a)
			if w.Code != tt.status || a.Code != tt.code {
				t.Fatalf("got %d %s (%s), want %d %s", w.Code, a.Code, w.Body, tt.status, tt.code)
			}
			got := n.nudged()[before:]
			if tt.nudged == "" && len(got) != 0 || tt.nudged != "" && (len(got) != 1 || got[0] != tt.nudged) {
				t.Fatalf("nudged %v, want %q", got, tt.nudged)
			}
			if w.Code == 202 && (a.WorkflowID != tt.nudged || a.Followed != n.follows[tt.nudged]) {
				t.Fatalf("answer %s, want workflowId %s followed %v", w.Body, tt.nudged, n.follows[tt.nudged])
			}
		})
	}
	t.Run("CrossOrigin", func(t *testing.T) {
		before := len(n.nudged())
		req := notifyRequest(testNotifySecret, "application/json", summary("wf-1", "PAUSED"))
		req.Header.Set("Origin", "http://evil.example")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 403 || !strings.Contains(w.Body.String(), "CROSS_ORIGIN_REFUSED") || len(n.nudged()) != before {
			t.Fatalf("got %d %s, nudged %v, want 403 CROSS_ORIGIN_REFUSED and no check", w.Code, w.Body, n.nudged()[before:])
		}
	})
	t.Run("NotServedWithoutSecret", func(t *testing.T) {
		for _, secret := range []string{"", testNotifySecret[:httpapi.MinNotifySecretBytes-1]} {
			h := httpapi.NewServer(httpapi.Options{Notifications: n, NotifySecret: []byte(secret)}).Handler()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, notifyRequest(secret, "application/json", summary("wf-1", "PAUSED")))
			if w.Code != 404 {
				t.Fatalf("secret %q: got %d %s, want 404", secret, w.Code, w.Body)
			}
		}
	})
}

// FuzzWorkflowNotification feeds notification bodies through the real
// handler: never a panic or a 500, a refused body reaches no check, and a
// body the decoder accepts is checked for its workflowId.
func FuzzWorkflowNotification(f *testing.F) {
	for _, seed := range []string{
		summary("wf-1", "PAUSED"), summary("wf-1", "RUNNING"), `{"workflowId":"wf-1","status":"COMPLETED"}`, `{}`, `null`, `[]`, `""`,
		`{"workflowId":1,"status":"PAUSED"}`, `{"workflowId":"a\u0000b","status":"PAUSED"}`, `{"workflowId":"` + strings.Repeat("w", 2000) + `","status":"PAUSED"}`,
		`{"workflowId":"wf-1","status":"PAUSED"} {}`, `{"workflowId":"wf-1","workflowId":"wf-2","status":"PAUSED"}`, `{"workflowId":"\udc00","status":"PAUSED"}`,
		`{"workflowId":"wf-1","status":"paused"}`, "\xff\xfe", `{"workflowId":"wf-\xff","status":"PAUSED"}`,
	} {
		f.Add(seed)
	}
	n := &recordingNudger{}
	h := httpapi.NewServer(httpapi.Options{Notifications: n, NotifySecret: []byte(testNotifySecret)}).Handler()
	f.Fuzz(func(t *testing.T, body string) {
		before := len(n.nudged())
		w := httptest.NewRecorder()
		h.ServeHTTP(w, notifyRequest(testNotifySecret, "application/json", body))
		checkFuzzAnswer(t, w, body)
		got := n.nudged()[before:]
		decoded, err := httpapi.DecodeWorkflowNotification([]byte(body))
		switch {
		case w.Code >= 400 && len(got) != 0:
			t.Fatalf("refused body %q (%d) reached a check", body, w.Code)
		case w.Code == 202 && (err != nil || len(got) != 1 || got[0] != decoded.WorkflowID):
			t.Fatalf("accepted body %q: checked %v, decoded %+v, %v", body, got, decoded, err)
		case w.Code != 202 && w.Code < 400:
			t.Fatalf("body %q: %d", body, w.Code)
		}
	})
}
