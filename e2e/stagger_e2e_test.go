package e2e

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// staggerRuns and staggerRate: 60 runs resumed at 20/s take 3 s, so a
// second holding more than the rate is seen whatever the phase.
const (
	staggerRuns = 60
	staggerRate = 20
	// staggerSlack is what a second may hold above the rate: a resume's
	// persistedAt is its start plus the time of its append (a snapshot
	// read and a JetStream publish), and on a loaded machine that time
	// varies by up to 200 ms between resumes; a second then takes in the
	// starts of 1.2 s: 20 * 1.2 = 24, plus one for the window's edge.
	staggerSlack = 5
)

// TestE2E_StaggeredResumeKeepsItsRate: `resume --max-rate 20/s` of 60
// paused runs resumes them at 20 a second, counted from the persistedAt of
// their RunResumed: no second holds more than the rate (and the slack
// above). The same after a kill -9 right after the answer: the restarted
// sidecar finds every resume due and catches up at the asked rate, not all
// at once.
func TestE2E_StaggeredResumeKeepsItsRate(t *testing.T) {
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr)
	server := "http://" + addr
	ctx := context.Background()
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-stagger")+`","planVersion":"1","steps":[
		{"stepId":"long","executor":{"type":"sleep","seconds":600}}]}`)
	ids := make([]string, staggerRuns)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < staggerRuns; i += 8 {
				started, err := trySubmit(t, p, pl, uniq(fmt.Sprintf("req-%d", i)))
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = started.RunID
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	defer func() {
		_, _ = p.client.Bulk(ctx, "cancel", httpapi.BulkRequest{PlanID: pl.PlanID, Reason: "test over"})
	}()
	waitStatus := func(status string) {
		t.Helper()
		sidecartest.WaitFor(t, fmt.Sprintf("all %d runs %s", staggerRuns, status), 2*time.Minute, func() bool {
			l, err := listAll(ctx, p.client, url.Values{"planId": {pl.PlanID}, "status": {status}})
			return err == nil && len(l.Runs) == staggerRuns
		})
	}
	pauseAll := func() {
		t.Helper()
		waitStatus(statestore.RunStatusRunning)
		res, err := p.client.Bulk(ctx, "pause", httpapi.BulkRequest{PlanID: pl.PlanID, Reason: "maintenance"})
		if err != nil || res.Counts[httpapi.OutcomePaused] != staggerRuns {
			t.Fatalf("bulk pause: %v %v", res, err)
		}
	}
	// perSecond counts the RunResumed of cycle by the second of their
	// persistedAt, and says how long they took from first to last.
	perSecond := func(cycle int64) (counts map[int64]int, span time.Duration) {
		t.Helper()
		counts = map[int64]int{}
		var times []time.Time
		for _, id := range ids {
			n := 0
			for _, e := range allEvents(t, p, id) {
				if e.EventType == statestore.RunResumed && e.LogicalAttemptID == cycle {
					at, err := time.Parse(time.RFC3339Nano, e.PersistedAt)
					if err != nil {
						t.Fatal(err)
					}
					counts[at.Unix()]++
					times = append(times, at)
					n++
				}
			}
			if n != 1 {
				t.Fatalf("run %s: %d RunResumed of cycle %d, want 1", id, n, cycle)
			}
		}
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		return counts, times[len(times)-1].Sub(times[0])
	}
	check := func(what string, counts map[int64]int, span time.Duration) {
		t.Helper()
		var secs []int64
		for s := range counts {
			secs = append(secs, s)
		}
		sort.Slice(secs, func(i, j int) bool { return secs[i] < secs[j] })
		var seq []int
		for s := secs[0]; s <= secs[len(secs)-1]; s++ {
			seq = append(seq, counts[s])
		}
		t.Logf("%s: resumes per second %v, first to last %v", what, seq, span.Round(time.Millisecond))
		for _, n := range seq {
			if n > staggerRate+staggerSlack {
				t.Errorf("%s: %d resumes in one second, want at most %d/s (+%d)", what, n, staggerRate, staggerSlack)
			}
		}
		// And never ahead overall: the 59 spacings of 50 ms (less the
		// jitter of the first and last append) are all there.
		if least := time.Duration(staggerRuns-2) * time.Second / staggerRate; span < least {
			t.Errorf("%s: first to last %v, want at least %v", what, span, least)
		}
	}

	// The CLI's staggered resume, the sidecar running throughout.
	pauseAll()
	code, out, errOut := sidecartest.Run(t, "resume", "--plan", pl.PlanID, "--reason", "dependency back", "--max-rate", fmt.Sprintf("%d/s", staggerRate), "--server", server)
	if code != 0 {
		t.Fatalf("resume --max-rate: exit %d\n%s%s", code, out, errOut)
	}
	waitStatus(statestore.RunStatusRunning)
	counts, span := perSecond(1)
	check("running sidecar", counts, span)

	// Paused again and resumed at the same rate, then kill -9: every
	// scheduled resume falls due while no sidecar runs.
	pauseAll()
	res, err := p.client.Bulk(ctx, "resume", httpapi.BulkRequest{PlanID: pl.PlanID, Reason: "dependency back", MaxPerSecond: staggerRate})
	p.stop(syscall.SIGKILL)
	if err != nil || res.Counts[httpapi.OutcomeResumed] != 1 || res.Counts[httpapi.OutcomeScheduled] != staggerRuns-1 {
		t.Fatalf("staggered resume: %v %v", res, err)
	}
	time.Sleep(time.Duration(staggerRuns/staggerRate+2) * time.Second)
	p = startServe(t, dataDir, addr)
	waitStatus(statestore.RunStatusRunning)
	counts, span = perSecond(2)
	check("after a restart", counts, span)
}
