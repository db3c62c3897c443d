package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// TestServer_Classify pins the answer (status, code, message, field,
// Retry-After) of every package's errors as the handlers return them.
func TestServer_Classify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("handler: %w", err) }
	problems := &plan.ValidationError{Code: plan.CodePlanInvalid, Problems: []plan.Problem{{Code: plan.CodeNoSteps, Message: "no steps"}}}
	inProgress := &adapter.Error{Code: adapter.CodeRunStartInProgress, Op: "start", RetryAt: time.Now().Add(time.Hour)}
	refused := &natsstore.WriteRefusedError{Stream: "KV_SIDECAR_RUNS", Cause: "write error: file too large", DataDir: "/var/lib/sidecar", Err: context.DeadlineExceeded}
	type want struct {
		status  int
		code    string
		message string // "" means err.Error()
		field   string
		retry   bool
	}
	for _, tc := range []struct {
		name string
		err  error
		want want
	}{
		{"SchemaValidation", wrap(&statestore.Error{Code: statestore.CodeSchemaValidationFailed, Field: "timeoutSeconds", Message: "must be >= 0"}),
			want{http.StatusBadRequest, statestore.CodeSchemaValidationFailed, "must be >= 0", "timeoutSeconds", false}},
		{"InvalidTransition", wrap(&statestore.Error{Code: statestore.CodeInvalidTransition, Message: "RunResumed is not allowed from RUNNING"}),
			want{http.StatusConflict, statestore.CodeInvalidTransition, "RunResumed is not allowed from RUNNING", "", false}},
		{"StoreUnavailable", &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "append: timeout"},
			want{http.StatusServiceUnavailable, statestore.CodeStoreUnavailable, "append: timeout", "", false}},
		{"StoreDamaged", &statestore.Error{Code: statestore.CodeStoreDamaged, Message: "rolled back"},
			want{http.StatusServiceUnavailable, statestore.CodeStoreDamaged, "rolled back", "", false}},
		{"DrainRunNotFound", wrap(drain.ErrRunNotFound), want{http.StatusNotFound, CodeRunNotFound, "no such run", "", false}},
		{"DrainStepNotFound", drain.ErrStepNotFound, want{http.StatusNotFound, drain.CodeStepNotFound, "no such step in this run", "", false}},
		{"LogRunNotFound", wrap(statestore.ErrNotFound), want{http.StatusNotFound, CodeRunNotFound, "no such run", "", false}},
		// A fault with a name keeps it: a client tells a damaged log or
		// archive from a fault of the sidecar's (INTERNAL).
		{"ChainBroken", &statestore.Error{Code: pgstore.CodeChainBroken, Message: "record 3 changed"}, want{http.StatusInternalServerError, pgstore.CodeChainBroken, "", "", false}},
		{"ArchiveCorrupt", wrap(&archive.Error{Code: archive.CodeCorrupt, Message: "segment s: SHA-256 a, manifest 1 says b"}), want{http.StatusInternalServerError, archive.CodeCorrupt, "", "", false}},
		{"Unnamed", errors.New("boom"), want{http.StatusInternalServerError, CodeInternal, "", "", false}},
		{"AdmissionRejected", &admission.Error{Code: admission.CodeRejected, Message: "limit 3 reached", RetryAfter: 10 * time.Second},
			want{http.StatusTooManyRequests, admission.CodeRejected, "", "", true}},
		{"AdmissionUnavailable", &admission.Error{Code: admission.CodeUnavailable, Message: "submit", Err: errors.New("timeout")},
			want{http.StatusServiceUnavailable, admission.CodeUnavailable, "", "", false}},
		{"BusSinkUnknown", &eventbus.Error{Code: eventbus.CodeSinkUnknown, Message: `no sink named "x"`}, want{http.StatusNotFound, eventbus.CodeSinkUnknown, "", "", false}},
		{"BusUnavailable", &eventbus.Error{Code: eventbus.CodeUnavailable, Message: "read cursor"}, want{http.StatusServiceUnavailable, eventbus.CodeUnavailable, "", "", false}},
		{"PlanInvalid", wrap(problems), want{http.StatusBadRequest, CodePlanInvalid, problems.Error(), "", false}},
		{"EngineUnavailable", wrap(&adapter.Error{Code: adapter.CodeEngineUnavailable, Op: "pause", Err: errors.New("connection refused")}),
			want{http.StatusServiceUnavailable, adapter.CodeEngineUnavailable, "", "", false}},
		{"RunRegistryUnavailable", &adapter.Error{Code: adapter.CodeRunRegistryUnavailable, Op: "get run"}, want{http.StatusServiceUnavailable, adapter.CodeRunRegistryUnavailable, "", "", false}},
		{"RunStartInProgress", inProgress, want{http.StatusConflict, adapter.CodeRunStartInProgress, "", "", true}},
		{"EngineConflict", &adapter.Error{Code: adapter.CodeConflict, Op: "resume", Status: 409}, want{http.StatusConflict, adapter.CodeConflict, "", "", false}},
		{"EngineNotFound", &adapter.Error{Code: adapter.CodeNotFound, Op: "get run"}, want{http.StatusNotFound, adapter.CodeNotFound, "", "", false}},
		{"EngineRejected", &adapter.Error{Code: adapter.CodeEngineRejected, Op: "start", Status: 400}, want{http.StatusBadGateway, adapter.CodeEngineRejected, "", "", false}},
		{"InvalidInput", &adapter.Error{Code: adapter.CodeInvalidInput, Op: "start", Message: "empty id"}, want{http.StatusBadRequest, adapter.CodeInvalidInput, "", "", false}},
		{"PlanVersionConflict", &adapter.Error{Code: adapter.CodePlanVersionConflict, Op: "register plan"}, want{http.StatusConflict, CodePlanConflict, "", "", false}},
		{"ListSyncing", runlist.ErrSyncing, want{http.StatusServiceUnavailable, runlist.CodeSyncing, "the run list is being read from NATS; try again in a second", "", true}},
		{"ListSelector", &runlist.Error{Code: runlist.CodeSelectorInvalid, Message: "bad selector"}, want{http.StatusBadRequest, runlist.CodeSelectorInvalid, "bad selector", "labelSelector", false}},
		{"ListContinue", &runlist.Error{Code: runlist.CodeContinueInvalid, Message: "bad token"}, want{http.StatusBadRequest, runlist.CodeContinueInvalid, "bad token", "continue", false}},
		{"ListUnavailable", fmt.Errorf("%w: read cursor: %w", runlist.ErrUnavailable, errors.New("timeout")), want{http.StatusServiceUnavailable, statestore.CodeStoreUnavailable, "", "", false}},
		{"RegistryUnavailable", fmt.Errorf("%w: get key k: %w", registry.ErrUnavailable, errors.New("timeout")), want{http.StatusServiceUnavailable, statestore.CodeStoreUnavailable, "", "", false}},
		{"WriteRefusedUnderRegistry", wrap(&adapter.Error{Code: adapter.CodeRunRegistryUnavailable, Op: "record run request", Err: refused}),
			want{http.StatusServiceUnavailable, natsstore.CodeWriteRefused, refused.Message(), "", false}},
		{"WriteRefusedUnderStore", &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "append: " + refused.Error(), Err: refused},
			want{http.StatusServiceUnavailable, natsstore.CodeWriteRefused, refused.Message(), "", false}},
		{"Deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), want{http.StatusServiceUnavailable, CodeUnavailable, "", "", false}},
		{"Uncoded", errors.New("boom"), want{http.StatusInternalServerError, CodeInternal, "", "", false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := (&Server{}).classify(tc.err)
			msg := tc.want.message
			if msg == "" {
				msg = tc.err.Error()
			}
			if got.status != tc.want.status || got.Code != tc.want.code || got.Message != msg || got.Field != tc.want.field || (got.retryAfter > 0) != tc.want.retry {
				t.Errorf("got %d %s %q field %q retry %v\nwant %d %s %q field %q retry %v", got.status, got.Code, got.Message, got.Field, got.retryAfter,
					tc.want.status, tc.want.code, msg, tc.want.field, tc.want.retry)
			}
		})
	}
}
