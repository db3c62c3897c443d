package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// An update that could not be taken because Conductor did not answer the
// read of its task is answered 502 CONDUCTOR_UNAVAILABLE, pointing at
// Conductor; one the store did not take, 503 STATE_STORE_UNAVAILABLE.
// Before, both were the store's.
func TestProxy_NotRecordedNamesWhatWasAway(t *testing.T) {
	p := &Proxy{}
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("read task: %w", &adapter.Error{Code: adapter.CodeEngineUnavailable, Op: "get_task"}), http.StatusBadGateway, CodeConductorUnavailable},
		{fmt.Errorf("append: %w", statestore.ErrUnavailable), http.StatusServiceUnavailable, CodeStoreUnavailable},
	} {
		rec := httptest.NewRecorder()
		p.notRecorded(rec, c.err)
		var body struct{ Code string }
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != c.status || body.Code != c.code {
			t.Errorf("%v: %d %s, want %d %s", c.err, rec.Code, body.Code, c.status, c.code)
		}
	}
}
