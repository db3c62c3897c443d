package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_AdoptedParentDrainsWhileItsChildIsPaused: an adopted parent's
// SUB_WORKFLOW task stays in progress while its child workflow is paused,
// and nothing of the child runs then; a pause of the parent drains at once
// (the step idle: RunStepTryEnded, subWorkflowPaused), not at its timeout.
// The child is itself a parent, of a paused leaf: the child's pause drains
// at once too, and so does the parent's through two levels. Once the child
// runs again (resumed after the parent), the parent's step is in flight
// again (RunStepTryStarted), and the parent's next pause drains for it,
// even when it comes right after the child's resume.
func TestE2E_AdoptedParentDrainsWhileItsChildIsPaused(t *testing.T) {
	t.Parallel() // its own serve, data dir and definitions
	condURL := conductortest.URL(t)
	leaf := uniq("adopt_leaf_paused")
	registerDef(t, condURL, leaf, []map[string]any{
		{"name": "hold", "taskReferenceName": "hold", "type": "WAIT", "inputParameters": map[string]any{"duration": "10 minutes"}},
	})
	child := uniq("adopt_child_paused")
	registerDef(t, condURL, child, []map[string]any{
		{"name": "leaf", "taskReferenceName": "leaf", "type": "SUB_WORKFLOW", "subWorkflowParam": map[string]any{"name": leaf, "version": 1}},
	})
	parent := uniq("adopt_parent")
	registerDef(t, condURL, parent, []map[string]any{
		{"name": "sub", "taskReferenceName": "sub", "type": "SUB_WORKFLOW", "subWorkflowParam": map[string]any{"name": child, "version": 1}},
	})
	p := newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: condURL, DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t),
		Args: []string{"--adopt", parent, "--adopt", child, "--adopt", leaf}}))
	parentID := startWorkflow(t, condURL, parent, "", map[string]any{})
	t.Cleanup(func() { // terminates the child too (409 once it ended)
		req, _ := http.NewRequest(http.MethodDelete, condURL+"/workflow/"+parentID+"?reason=test+ended", nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	})
	subOf := func(id, ref string) (sub string) {
		var wf struct {
			Tasks []struct{ ReferenceTaskName, SubWorkflowId string }
		}
		conductorJSON(t, http.MethodGet, condURL+"/workflow/"+id+"?includeTasks=true", nil, &wf)
		for _, task := range wf.Tasks {
			if task.ReferenceTaskName == ref {
				sub = task.SubWorkflowId
			}
		}
		return sub
	}
	var childID, leafID string
	sidecartest.WaitFor(t, "Conductor to start the child and the leaf", 60*time.Second, func() bool {
		if childID == "" {
			childID = subOf(parentID, "sub")
		}
		if childID != "" {
			leafID = subOf(childID, "leaf")
		}
		return leafID != ""
	})
	sidecartest.WaitFor(t, "the three runs adopted, their SUB_WORKFLOW steps started", 60*time.Second, func() bool {
		return eventIndex(eventsOf(t, p, leafID), statestore.RunStarted, "", 0) >= 0 &&
			eventIndex(eventsOf(t, p, childID), statestore.StepStarted, "leaf", 0) >= 0 &&
			eventIndex(eventsOf(t, p, parentID), statestore.StepStarted, "sub", 0) >= 0
	})

	// The leaf paused first (its WAIT holds no drain), then the child
	// (its drain ends: the leaf is paused), then the parent.
	_, err := p.client.Pause(t.Context(), leafID, 120, "leaf first")
	recordedDespiteConductor(t, "pause of the leaf", err)
	_, err = p.client.Pause(t.Context(), childID, 120, "child while the leaf is paused")
	recordedDespiteConductor(t, "pause of the child", err)
	sidecartest.WaitFor(t, "the child's drain to end", 30*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, childID))
		return how == statestore.RunDrainCompleted
	})
	_, err = p.client.Pause(t.Context(), parentID, 120, "parent while its child is paused")
	recordedDespiteConductor(t, "pause of the parent", err)
	sidecartest.WaitFor(t, "the parent's drain to end", 30*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, parentID))
		return how != ""
	})
	evs := allEvents(t, p, parentID)
	if _, how := drainEnd(t, evs); how != statestore.RunDrainCompleted {
		t.Fatalf("parent's drain ended with %s, want RunDrainCompleted\n%v", how, stepTypes(evs))
	}
	ended := eventIndex(evs, statestore.RunStepTryEnded, "", 0)
	if ended < 0 || !strings.Contains(string(evs[ended].Payload), `"subWorkflowPaused"`) {
		t.Fatalf("want RunStepTryEnded (subWorkflowPaused) for sub\n%v", stepTypes(evs))
	}

	// The parent resumed while the child stays paused: the step stays
	// idle; the child resumed: it is in flight again.
	_, err = p.client.Resume(t.Context(), parentID)
	recordedDespiteConductor(t, "resume of the parent", err)
	sidecartest.WaitFor(t, "the parent's resume in the log", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, parentID), statestore.RunResumed, "", 0) >= 0
	})
	time.Sleep(3 * time.Second) // the adopter reads the parent every second meanwhile
	if evs := allEvents(t, p, parentID); eventIndex(evs, statestore.RunStepTryStarted, "", 0) >= 0 {
		t.Fatalf("sub in flight again while its child is still paused\n%v", stepTypes(evs))
	}
	// The child resumed and the parent paused right after, before any
	// interval read of the adopter: the pause still finds the child
	// running, and drains for it.
	_, err = p.client.Resume(t.Context(), childID)
	recordedDespiteConductor(t, "resume of the child", err)
	v, err := p.client.Pause(t.Context(), parentID, 120, "parent while its child runs")
	recordedDespiteConductor(t, "second pause of the parent", err)
	if v != nil && v.Substatus != "DRAINING" {
		t.Errorf("second pause answered %s/%s, want PAUSED/DRAINING: the child runs", v.Status, v.Substatus)
	}
	if got := inFlight(t, p, parentID); !slices.Contains(got, "sub") {
		t.Fatalf("in flight %v after the second pause, want sub: the child runs\n%v", got, stepTypes(allEvents(t, p, parentID)))
	}
	childEvs := allEvents(t, p, childID)
	evs = allEvents(t, p, parentID)
	again := eventIndex(evs, statestore.RunStepTryStarted, "", 0)
	if again < 0 {
		t.Fatalf("sub not in flight again\n%v", stepTypes(evs))
	}
	resumed, _ := time.Parse(time.RFC3339Nano, childEvs[eventIndex(childEvs, statestore.RunResumed, "", 0)].PersistedAt)
	if at, _ := time.Parse(time.RFC3339Nano, evs[again].PersistedAt); at.Before(resumed) {
		t.Fatalf("sub in flight again at %s, before the child was resumed at %s\n%v", at, resumed, stepTypes(evs))
	}
	validLog(t, allEvents(t, p, parentID))
}
