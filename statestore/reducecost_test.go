package statestore_test

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// runOfSteps is a RUNNING run of n steps, each started, every tenth
// completed with an artifact; next is the following record's builder.
func runOfSteps(n int) (*statestore.RunSnapshot, *logBuilder) {
	b := newLog("cost").ev(statestore.RunStarted)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("step-%04d", i)
		b.step(statestore.StepStarted, id)
		if i%10 == 9 {
			b.add(statestore.StepCompleted, id, 1, map[string]any{"artifacts": []any{map[string]any{"uri": "u/" + id, "kind": "stdout"}}})
		}
	}
	snap, _ := statestore.Reduce(nil, b.recs)
	return snap, b
}

// TestReduce_OneRecordCostDoesNotGrowWithSteps: applying one record to a
// snapshot copies no step's own data and builds no index of the run's
// steps, so that a projection catching up by one record (the gate's read
// of a run, per gated task) makes as many allocations on a run of 450
// steps as on one of 10, and allocates no more bytes than the copy of the
// Steps slice's elements (rounded up to the allocator's 8 KiB pages).
func TestReduce_OneRecordCostDoesNotGrowWithSteps(t *testing.T) {
	cost := func(n int) (allocs, beyondSteps float64) {
		snap, b := runOfSteps(n)
		b.step(statestore.StepCompleted, "step-0000")
		rec := b.recs[len(b.recs)-1:]
		allocs = testing.AllocsPerRun(50, func() { statestore.Reduce(snap, rec) })
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range 50 {
			statestore.Reduce(snap, rec)
		}
		runtime.ReadMemStats(&m1)
		perRun := float64(m1.TotalAlloc-m0.TotalAlloc) / 50
		return allocs, perRun - float64(n)*float64(unsafe.Sizeof(statestore.StepSnapshot{}))
	}
	smallAllocs, smallBytes := cost(10)
	largeAllocs, largeBytes := cost(450)
	if largeAllocs > smallAllocs+1 {
		t.Fatalf("one StepCompleted onto a run of 450 steps: %.0f allocations, of 10 steps: %.0f; want the same", largeAllocs, smallAllocs)
	}
	if largeBytes > smallBytes+8192+1024 {
		t.Fatalf("one StepCompleted onto a run of 450 steps: %.0f bytes beyond the Steps copy, of 10 steps: %.0f", largeBytes, smallBytes)
	}
}

// TestReduce_SiblingsShareNothingWritable: two snapshots reduced from the
// same one (two readers catching up differently, or a fence's retry)
// never see each other's changes, nor does their parent, also where a
// step's artifacts or the run's lists grow.
func TestReduce_SiblingsShareNothingWritable(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").
		add(statestore.StepFailed, "a", 1, map[string]any{"error": map[string]any{"code": "X", "message": "m"},
			"artifacts": []any{map[string]any{"uri": "u1", "kind": "k"}}}).
		add(statestore.RunStepRetryRequested, "", 2, map[string]any{"stepId": "a", "stepLogicalAttemptId": 2}).
		add(statestore.StepStarted, "a", 2, nil).step(statestore.StepStarted, "b")
	parent, _ := reduce(t, b.recs)
	keep := parent.Clone()
	one := newLog("r")
	one.seq = b.seq
	one.add(statestore.StepFailed, "a", 2, map[string]any{"error": map[string]any{"code": "Y", "message": "m"},
		"artifacts": []any{map[string]any{"uri": "one", "kind": "k"}}})
	two := newLog("r")
	two.seq = b.seq
	two.add(statestore.StepFailed, "a", 2, map[string]any{"error": map[string]any{"code": "Z", "message": "m"},
		"artifacts": []any{map[string]any{"uri": "two", "kind": "k"}}}).
		step(statestore.StepCompleted, "b").ev(statestore.RunCompleted)
	s1, _ := statestore.Reduce(parent, one.recs)
	s2, _ := statestore.Reduce(parent, two.recs)
	if !reflect.DeepEqual(parent, keep) {
		t.Fatalf("the parent changed:\n%+v\n%+v", parent, keep)
	}
	if got := s1.Step("a"); got.Error.Code != "Y" || len(got.Artifacts) != 1 || got.Artifacts[0].URI != "one" {
		t.Fatalf("first sibling's step: %+v", got)
	}
	if got := s2.Step("a"); got.Error.Code != "Z" || len(got.Artifacts) != 1 || got.Artifacts[0].URI != "two" {
		t.Fatalf("second sibling's step: %+v", got)
	}
	if s1.Step("b").Status != statestore.StepStatusRunning || s1.Status != statestore.RunStatusRunning {
		t.Fatalf("the second sibling's records reached the first: %+v", s1)
	}
	s3, _ := statestore.Reduce(parent, two.recs)
	if !reflect.DeepEqual(s2, s3) {
		t.Fatalf("the same records onto the same parent gave two snapshots:\n%+v\n%+v", s2, s3)
	}
}

// TestReduce_SiblingsShareNoListOrPause: the run's list of ignored
// events and its pause state, which later records grow or change, are
// the parent's alone too.
func TestReduce_SiblingsShareNoListOrPause(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a")
	for range 3 {
		b.ev(statestore.RunQueued) // invalid on a RUNNING run: listed in InvalidEvents
	}
	b.ev(statestore.RunPaused)
	parent, _ := reduce(t, b.recs)
	if len(parent.InvalidEvents) != 3 || parent.Pause == nil {
		t.Fatalf("setup: %+v", parent)
	}
	keep := parent.Clone()
	sibling := func() (*statestore.RunSnapshot, string) {
		l := newLog("r")
		l.seq, l.at = b.seq, b.at
		l.ev(statestore.RunQueued).ev(statestore.RunResumed)
		s, _ := statestore.Reduce(parent, l.recs)
		return s, l.recs[0].EventID
	}
	s1, id1 := sibling()
	s2, id2 := sibling()
	if !reflect.DeepEqual(parent, keep) {
		t.Fatalf("the parent changed:\n%+v\n%+v", parent, keep)
	}
	if len(s1.InvalidEvents) != 4 || s1.InvalidEvents[3] != id1 || len(s2.InvalidEvents) != 4 || s2.InvalidEvents[3] != id2 || id1 == id2 {
		t.Fatalf("ignored events: first %v (want %s last), second %v (want %s last)", s1.InvalidEvents, id1, s2.InvalidEvents, id2)
	}
}

// BenchmarkReduceOneRecord is the cost of one record applied to a run of
// 10 and of 450 steps: a StepCompleted of a started step, and the
// StepStarted of a new one.
func BenchmarkReduceOneRecord(b *testing.B) {
	for _, n := range []int{10, 450} {
		snap, lb := runOfSteps(n)
		seq := lb.seq
		lb.step(statestore.StepCompleted, "step-0000")
		completed := lb.recs[len(lb.recs)-1:]
		lb.seq = seq
		lb.step(statestore.StepStarted, "new-step")
		started := lb.recs[len(lb.recs)-1:]
		for _, c := range []struct {
			name string
			rec  []statestore.RunEventRecord
		}{{"completed", completed}, {"started", started}} {
			b.Run(fmt.Sprintf("steps=%d/%s", n, c.name), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					statestore.Reduce(snap, c.rec)
				}
			})
		}
	}
}
