package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// WorkflowNudger checks the run of a Conductor workflow at once, as its
// next scan would; *adapter.Watcher satisfies it. NudgeWorkflow never
// blocks, and reports whether workflowID is the workflow of a run the
// sidecar follows.
type WorkflowNudger interface {
	NudgeWorkflow(workflowID string) bool
}

// The intake of Conductor's workflow status notifications
// (docs/conductor.md, "Status notifications"): Conductor's
// workflow_publisher status listener POSTs a workflow's summary to
// <conductor.status-notifier.notification.url>/<endpoint-workflow> with one
// header of the operator's choice, here NotifySecretHeader carrying the
// shared secret.
const (
	// NotifyPath is the path Conductor posts to: its url is the API's
	// base URL + "/v1/conductor", its endpoint-workflow "workflow-status".
	NotifyPath = "/v1/conductor/workflow-status"
	// NotifySecretHeader carries the shared secret (Conductor's
	// header-prefer; the secret is header-prefer-value).
	NotifySecretHeader = "X-Sidecar-Notify-Secret"
	// MaxNotificationBytes bounds a notification's body: the workflow's
	// summary, with its input and output as JSON strings.
	MaxNotificationBytes = 1 << 20
	// MinNotifySecretBytes is the shortest secret Options.NotifySecret may be.
	MinNotifySecretBytes = 16
)

// notifiedStatuses are the workflow statuses a notification may carry
// (a resume is notified with the status RUNNING).
var notifiedStatuses = map[string]bool{
	"RUNNING": true, "PAUSED": true, "COMPLETED": true, "FAILED": true, "TIMED_OUT": true, "TERMINATED": true,
}

// WorkflowNotification is what the sidecar reads of a status notification:
// the workflow and the status it had when Conductor sent it.
type WorkflowNotification struct {
	WorkflowID string `json:"workflowId"`
	Status     string `json:"status"`
}

// DecodeWorkflowNotification decodes the body of a status notification, a
// JSON object with workflowId (the one id rule, statestore.CheckID) and
// status (RUNNING, PAUSED, COMPLETED, FAILED, TIMED_OUT or TERMINATED); the
// summary's other fields are ignored. Any other body is a BAD_REQUEST
// *apiError.
func DecodeWorkflowNotification(data []byte) (WorkflowNotification, error) {
	var n struct {
		WorkflowID *string `json:"workflowId"`
		Status     *string `json:"status"`
	}
	if at := loneSurrogate(data); at >= 0 {
		return WorkflowNotification{}, badRequest("", fmt.Sprintf("malformed JSON body: a \\u escape at byte %d is a lone UTF-16 surrogate", at))
	}
	if err := json.Unmarshal(data, &n); err != nil {
		return WorkflowNotification{}, badRequest("", "malformed JSON body: "+err.Error())
	}
	if n.WorkflowID == nil {
		return WorkflowNotification{}, badRequest("workflowId", "workflowId is missing")
	}
	if err := checkID("workflowId", *n.WorkflowID, false); err != nil {
		return WorkflowNotification{}, err
	}
	if n.Status == nil || !notifiedStatuses[*n.Status] {
		got := "missing"
		if n.Status != nil {
			got = fmt.Sprintf("%.40q", *n.Status)
		}
		return WorkflowNotification{}, badRequest("status", "status is "+got+"; want one of RUNNING, PAUSED, COMPLETED, FAILED, TIMED_OUT, TERMINATED")
	}
	return WorkflowNotification{WorkflowID: *n.WorkflowID, Status: *n.Status}, nil
}

// notifySecret is the shared secret's digest: comparing digests takes the
// same time whatever the header holds, its length included.
func notifySecret(secret []byte) [sha256.Size]byte { return sha256.Sum256(secret) }

// workflowStatus answers a status notification: a web page's request is
// refused as on every route (checkBrowser), 401 without the shared
// secret, 415/400/413 for a body that is not a notification (nothing
// checked), else 202 once the workflow's run is queued for a check
// (followed false: the workflow is no run's, and nothing is done).
func (s *Server) workflowStatus(w http.ResponseWriter, r *http.Request) error {
	if err := s.checkBrowser(r); err != nil { // as on every route of the API but the probes
		return err
	}
	got := sha256.Sum256([]byte(r.Header.Get(NotifySecretHeader)))
	if subtle.ConstantTimeCompare(got[:], s.notifySecret[:]) != 1 {
		return &apiError{status: http.StatusUnauthorized, Code: CodeUnauthenticated,
			Message: "a status notification needs the shared secret in " + NotifySecretHeader}
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return &apiError{status: http.StatusUnsupportedMediaType, Code: CodeBadRequest, Message: fmt.Sprintf("Content-Type %q: a notification needs Content-Type: application/json", ct)}
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		if ae, ok := tooLarge(err); ok {
			return ae
		}
		return badRequest("", "reading the body: "+err.Error())
	}
	n, err := DecodeWorkflowNotification(data)
	if err != nil {
		return err
	}
	followed := s.opts.Notifications.NudgeWorkflow(n.WorkflowID)
	return writeJSON(w, http.StatusAccepted, map[string]any{"workflowId": n.WorkflowID, "followed": followed})
}
