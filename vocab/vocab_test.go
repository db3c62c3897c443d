package vocab_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// coreTypes are the 24 events of the Core Events Specification v1.0: no
// other type may be emitted.
var coreTypes = []string{
	"EXECUTION_CREATED", "EXECUTION_STARTED", "EXECUTION_COMPLETED", "EXECUTION_ARCHIVED",
	"EXECUTION_CANCEL_REQUESTED", "EXECUTION_CANCELED", "EXECUTION_FAIL_REQUESTED", "EXECUTION_FAILED",
	"NODE_CREATED", "NODE_READY", "NODE_STARTED", "NODE_PROGRESS_REPORTED", "NODE_WAITING",
	"NODE_RESUME_REQUESTED", "NODE_RESUMED", "NODE_SUCCEEDED", "NODE_FAIL_REPORTED", "NODE_FAILED",
	"NODE_CANCEL_REQUESTED", "NODE_CANCELED", "NODE_INTERRUPT_REQUESTED",
	"FORK_OPENED", "JOIN_GATE_UPDATED", "JOIN_PASSED",
}

// noetlTypes are the v10 names the view may emit (NoETL Runtime Event Model
// v10 §3).
var noetlTypes = []string{
	"playbook.execution.requested", "playbook.request.evaluated", "playbook.started", "playbook.paused",
	"playbook.finished", "workflow.started", "workflow.finished", "step.started", "step.done", "step.failed",
}

type logBuilder struct {
	recs []statestore.RunEventRecord
	at   time.Time
}

func (b *logBuilder) add(typ, step string, attempt int64, payload any) *logBuilder {
	w := storetest.EventAt("run-1", typ, step, attempt)
	if payload != nil {
		storetest.WithPayload(w, payload)
	}
	b.at = b.at.Add(time.Second)
	b.recs = append(b.recs, statestore.RunEventRecord{RunEventWrite: *w, RunSeq: int64(10 * (len(b.recs) + 1)), PersistedAt: b.at.Format(time.RFC3339Nano)})
	return b
}

// aLog is a run through every kind of event: started, a step done, a
// step handed back and resumed then failed, paused and resumed, a retry,
// then cancelled (with a RunCompleted superseded by the cancel).
func aLog() []statestore.RunEventRecord {
	b := &logBuilder{at: time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)}
	b.add(statestore.RunStarted, "", 1, map[string]any{"engineType": "conductor"}).
		add(statestore.StepStarted, "a", 1, nil).
		add(statestore.StepCompleted, "a", 1, map[string]any{"artifacts": []any{map[string]any{"uri": "s3://x", "kind": "log"}}}).
		add(statestore.StepStarted, "b", 1, nil).
		add(statestore.RunPaused, "", 1, map[string]any{"reason": "db failover", "requestedBy": "jane"}).
		add(statestore.RunStepTryEnded, "", 1, map[string]any{"stepId": "b", "stepLogicalAttemptId": 1, "reason": "handedBack"}).
		add(statestore.RunDrainCompleted, "", 1, nil).
		add(statestore.RunResumed, "", 1, map[string]any{"requestedBy": "schedule"}).
		add(statestore.RunStepTryStarted, "", 1, map[string]any{"stepId": "b", "stepLogicalAttemptId": 1}).
		add(statestore.StepFailed, "b", 1, map[string]any{"error": map[string]any{"code": "EXIT_1", "message": "boom"}}).
		add(statestore.RunStepRetryRequested, "", 1, map[string]any{"stepId": "b", "stepLogicalAttemptId": 2}).
		add(statestore.StepSkipped, "c", 1, map[string]any{"reason": "upstream failed"}).
		add(statestore.RunCancelRequested, "", 1, map[string]any{"reason": "bad input"}).
		add(statestore.RunCompleted, "", 1, nil).
		add(statestore.RunCancelled, "", 1, nil)
	return b.recs
}

func TestCoreEvents(t *testing.T) {
	recs := aLog()
	got := vocab.CoreEvents(recs)
	var types []string
	ids := map[string]bool{}
	for _, e := range got {
		types = append(types, e.Type)
		if !slices.Contains(coreTypes, e.Type) {
			t.Errorf("%s is not one of the 24 Core Events", e.Type)
		}
		if ids[e.EventID] {
			t.Errorf("eventId %s twice", e.EventID)
		}
		ids[e.EventID] = true
		if e.ExecutionID != "run-1" || e.SchemaVersion != 1 || e.Actor == nil || e.CausationID == "" {
			t.Errorf("envelope of %s: %+v", e.Type, e)
		}
	}
	want := []string{"EXECUTION_CREATED", "EXECUTION_STARTED", "NODE_CREATED", "NODE_STARTED", "NODE_SUCCEEDED",
		"NODE_CREATED", "NODE_STARTED", "NODE_WAITING", "NODE_RESUMED", "NODE_FAILED", "NODE_READY",
		"NODE_CREATED", "NODE_CANCELED", "EXECUTION_CANCEL_REQUESTED", "EXECUTION_COMPLETED", "EXECUTION_CANCELED"}
	if !slices.Equal(types, want) {
		t.Fatalf("types:\n got %v\nwant %v", types, want)
	}
	// The event a record maps to carries its eventId; the view's own are
	// stable: the same log gives the same ids.
	if got[1].EventID != recs[0].EventID || got[0].EventID == recs[0].EventID {
		t.Fatalf("ids: created %s started %s, record %s", got[0].EventID, got[1].EventID, recs[0].EventID)
	}
	again := vocab.CoreEvents(recs)
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Fatal("the same log gave another view")
	}
	if got[7].Payload["nodeId"] != "b" || got[15].Actor.Kind != "system" {
		t.Fatalf("payloads: %+v %+v", got[7], got[15])
	}
}

func TestCoreEvents_QueuedRunCreatedOnce(t *testing.T) {
	b := &logBuilder{at: time.Now()}
	b.add(statestore.RunQueued, "", 1, nil).add(statestore.RunStarted, "", 1, nil)
	var types []string
	for _, e := range vocab.CoreEvents(b.recs) {
		types = append(types, e.Type)
	}
	if !slices.Equal(types, []string{"EXECUTION_CREATED", "EXECUTION_STARTED"}) {
		t.Fatalf("%v", types)
	}
}

func TestNoETLEvents(t *testing.T) {
	recs := aLog()
	got := vocab.NoETLEvents(recs)
	name := regexp.MustCompile(`^[a-z]+(\.[a-z]+)+$`)
	var types []string
	for i, e := range got {
		types = append(types, e.EventType)
		if !name.MatchString(e.EventType) || !slices.Contains(noetlTypes, e.EventType) {
			t.Errorf("%q is not a v10 canonical name the view may emit", e.EventType)
		}
		if e.Seq != i+1 || e.ExecutionID != "run-1" || e.Timestamp == "" || e.EventAlias == "" {
			t.Errorf("envelope of %s: %+v", e.EventType, e)
		}
	}
	want := []string{"playbook.started", "workflow.started", "step.started", "step.done", "step.started", "playbook.paused",
		"step.failed", "step.done", "workflow.finished", "playbook.finished"} // Cancel wins: the superseded RunCompleted finishes nothing
	if !slices.Equal(types, want) {
		t.Fatalf("types:\n got %v\nwant %v", types, want)
	}
	if got[0].EventAlias != "PlaybookStarted" || got[3].Status != "success" || got[6].Status != "error" || got[7].Status != "skipped" ||
		got[3].ParentID != "run-1" || got[2].Attempt != 1 {
		t.Fatalf("fields: %+v", got[:8])
	}
	if _, err := vocab.Translate("temporal", recs); err == nil {
		t.Fatal("an unknown vocabulary translated")
	}
}

// TestNoETLEvents_ResultRef: a step.done of a StepCompleted carries the
// step's outputs by reference (the NoETL model's "reference-first"): its
// payload.result_ref is the record's ArtifactRefs, as they are in the log;
// no other event has one.
func TestNoETLEvents_ResultRef(t *testing.T) {
	recs := aLog()
	var arts json.RawMessage
	for _, r := range recs {
		if r.EventType == statestore.StepCompleted {
			var p struct{ Artifacts json.RawMessage }
			if err := json.Unmarshal(r.Payload, &p); err != nil {
				t.Fatal(err)
			}
			arts = p.Artifacts
		}
	}
	n := 0
	for _, e := range vocab.NoETLEvents(recs) {
		ref, ok := e.Payload["result_ref"]
		if e.EventType != "step.done" || e.Status != "success" {
			if ok {
				t.Errorf("%s (%s) has a result_ref: %v", e.EventType, e.Status, ref)
			}
			continue
		}
		n++
		got, err := json.Marshal(ref)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		_ = json.Unmarshal(got, &g)
		_ = json.Unmarshal(arts, &w)
		if !ok || !reflect.DeepEqual(g, w) {
			t.Fatalf("step.done of %s: result_ref %s, want the StepCompleted's artifacts %s", e.EntityID, got, arts)
		}
	}
	if n != 1 {
		t.Fatalf("%d successful step.done events, want 1", n)
	}
}

// TestViews_PrefixStable: the views of a prefix of a run's records are a
// prefix of the views of all of them, each naming its record; the event
// bus translates only a batch's new records on that promise.
func TestViews_PrefixStable(t *testing.T) {
	log := aLog()
	for _, v := range []string{vocab.Sidecar, vocab.Core, vocab.NoETL} {
		all, err := vocab.Views(v, log)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k <= len(log); k++ {
			some, err := vocab.Views(v, log[:k])
			if err != nil {
				t.Fatal(err)
			}
			if len(some) > len(all) {
				t.Fatalf("%s: %d views of %d records, more than of all", v, len(some), k)
			}
			for i := range some {
				a, _ := json.Marshal(some[i].Event)
				b, _ := json.Marshal(all[i].Event)
				if string(a) != string(b) || some[i].Record != all[i].Record || some[i].Record >= k {
					t.Fatalf("%s: view %d of the first %d records differs from the full view's", v, i, k)
				}
			}
		}
	}
	if _, err := vocab.Views("cloudevents", log); !errors.Is(err, vocab.ErrUnknown) {
		t.Fatalf("an unknown vocabulary: %v", err)
	}
}
