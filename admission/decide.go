package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// ownerKey is the membership key of the decider.
const ownerKey = "admission"

// keepDecided is how long a decided entry stays (for Submit's repeat and
// its waiters) before the decider removes it.
const keepDecided = 2 * time.Minute

// loop mirrors the bucket and, while this replica owns the decider,
// decides the entries: at every change, and every second (delays, the
// list catching up, retries). The watch is natsstore's, which replaces a
// consumer the server stopped delivering from.
func (c *Controller) loop(ctx context.Context) {
	defer close(c.done)
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		w, err := natsstore.Watch(ctx, c.kv, jetstream.AllKeys, c.log)
		if err != nil {
			backoff = min(max(2*backoff, 100*time.Millisecond), 30*time.Second)
			c.log.Warn("admission: cannot watch the queue; retrying", zap.Duration("in", backoff), zap.Error(err))
			if !sleep(ctx, backoff) {
				return
			}
			continue
		}
		backoff = 0
		c.follow(ctx, w)
		_ = w.Stop()
	}
}

// follow applies the watch's updates and decides; it returns when the
// watch ends (ctx, or an error to recover from).
func (c *Controller) follow(ctx context.Context, w jetstream.KeyWatcher) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var nextTry, logged time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-w.Updates():
			if !ok {
				return
			}
			if !c.apply(u) || len(w.Updates()) > 0 {
				continue // decided at the last of a burst of new entries, or at the tick
			}
		case <-tick.C:
		}
		if c.opts.Owner != nil && !c.opts.Owner.Owns(ownerKey) {
			c.caughtUp = false // the next turn starts from the list again
			// Only the decider reports the queue: a replica that stopped
			// deciding shows none, not what it saw last (dashboards take
			// the max over replicas).
			c.opts.Metrics.depth(nil)
			continue
		}
		if time.Now().Before(nextTry) {
			continue
		}
		if err := c.decide(ctx); err != nil {
			nextTry = time.Now().Add(2 * time.Second)
			if time.Since(logged) >= time.Minute { // one line a minute while it fails
				logged = time.Now()
				c.log.Warn("admission: deciding failed; retrying every 2s", zap.Error(err))
			}
		}
	}
}

// apply puts a watch update in the mirror (nil: the initial values are
// all delivered) and tells whether it is a new entry to decide.
func (c *Controller) apply(u jetstream.KeyValueEntry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() {
		close(c.changed)
		c.changed = make(chan struct{})
	}()
	if u == nil {
		c.synced = true
		return true
	}
	if old := c.entries[u.Key()]; old != nil && u.Revision() <= old.rev {
		return false // the echo of a write the mirror already has
	}
	if u.Operation() != jetstream.KeyValuePut {
		delete(c.entries, u.Key())
		return false
	}
	var e entry
	if err := json.Unmarshal(u.Value(), &e); err != nil {
		c.log.Warn("admission: skipping a damaged entry", zap.String("key", u.Key()), zap.Error(err))
		return false
	}
	e.rev = u.Revision()
	if old := c.entries[u.Key()]; old != nil && e.Ticket == 0 {
		e.Ticket = old.ticket()
	}
	c.entries[u.Key()] = &e
	return e.State == statePending
}

// decide takes the waiting entries in ticket order and starts, queues,
// delays or rejects each.
func (c *Controller) decide(ctx context.Context) error {
	c.mu.Lock()
	synced := c.synced
	c.mu.Unlock()
	if !synced {
		return nil
	}
	c.cleanup(ctx)
	waiting := c.sortedWaiting()
	c.opts.Metrics.depth(waiting)
	if len(waiting) == 0 {
		return nil
	}
	if !c.caughtUp {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.opts.Active.WaitIndexed(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("the run list did not catch up with the log: %w", err)
		}
		c.caughtUp = true
	}
	total, byTenant, byPlan, ok := c.opts.Active.ActiveCounts()
	if !ok {
		return nil // the list is not read yet
	}
	c.mu.Lock()
	var unseen []string
	for id, e := range c.recent {
		if c.opts.Active.ShowsStarted(id) || time.Since(e.DecidedAt) > 2*time.Minute {
			delete(c.recent, id)
			continue
		}
		if time.Since(e.DecidedAt) > recentUnseen && time.Since(e.checked) > recentUnseen {
			e.checked = time.Now()
			unseen = append(unseen, id)
		}
	}
	c.mu.Unlock()
	// A run started seconds ago that the list still does not show may
	// have ended and left it already (retention that removes finished
	// runs within seconds): the log says so.
	for _, id := range unseen {
		snap, err := c.opts.Snapshots.ProjectSnapshot(ctx, id)
		if errors.Is(err, statestore.ErrNotFound) || (err == nil && statestore.IsTerminalRunStatus(snap.Status)) {
			c.mu.Lock()
			delete(c.recent, id)
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	for _, e := range c.recent {
		total++
		byTenant[e.TenantID]++
		byPlan[planOf(e)]++
	}
	c.mu.Unlock()
	l := c.opts.Limits
	blocked := map[string]bool{}
	now := time.Now()
	over := 0
	queued := 0                  // runs waiting under Queue or Delay (MaxQueued)
	queuedBy := map[string]int{} // and per tenant (MaxQueuedPerTenant)
	for _, e := range waiting {
		if e.State == stateQueued || e.State == stateDelayed {
			queued++
			queuedBy[e.TenantID]++
		}
	}
	var failed []error // starts refused in this pass, retried at the next
	for _, e := range waiting {
		// The domains the entry is held in: those whose limit is reached,
		// and those where an earlier waiting entry is held (their order is
		// kept). Only these hold back later entries: a tenant at its limit
		// does not hold back another tenant's runs.
		var full, held []string
		if l.Global > 0 && total >= l.Global {
			full, held = append(full, fmt.Sprintf("global limit %d", l.Global)), append(held, "global")
		}
		if l.PerTenant > 0 && byTenant[e.TenantID] >= l.PerTenant {
			full, held = append(full, fmt.Sprintf("tenant %s limit %d", e.TenantID, l.PerTenant)), append(held, "tenant:"+e.TenantID)
		}
		// A plan's limit is each tenant's: another tenant naming the same
		// planId neither takes its capacity nor learns its load.
		plan := "plan:" + e.TenantID + "\x00" + e.PlanID
		if l.PerPlan > 0 && byPlan[planOf(e)] >= l.PerPlan {
			full, held = append(full, fmt.Sprintf("plan %s limit %d", e.PlanID, l.PerPlan)), append(held, plan)
		}
		behind := false
		for _, d := range []string{"global", "tenant:" + e.TenantID, plan} {
			if blocked[d] {
				behind, held = true, append(held, d)
			}
		}
		switch {
		case e.State == stateStarting:
			// A start a crash or a lost owner interrupted: started again
			// (idempotent), whatever the load; it was admitted.
		case e.State == stateDelayed:
			if now.Before(e.NotBefore) {
				over++ // still over: a later delayed run waits behind it
				continue
			}
		case len(full) > 0 || behind:
			// Over a limit, or behind an earlier run of the same tenant,
			// plan or the whole that waits: in order.
			for _, d := range held {
				blocked[d] = true
			}
			over++
			if e.State == statePending {
				reason := strings.Join(full, ", ")
				if reason == "" {
					reason = "behind earlier queued runs"
				}
				if m := c.opts.MaxQueuedPerTenant; m > 0 && queuedBy[e.TenantID] >= m && e.Policy != Reject {
					// The tenant's share of the queue is full: refused as
					// under Reject, whatever room the queue has for others.
					reason = fmt.Sprintf("%s, and %d runs of tenant %s wait already (--admission-max-queued-per-tenant %d)", reason, queuedBy[e.TenantID], e.TenantID, m)
					if err := c.reject(ctx, e, reason); err != nil {
						return err
					}
					continue
				}
				if m := c.opts.MaxQueued; m > 0 && queued >= m && e.Policy != Reject {
					// The queue is full: refused as under Reject.
					reason = fmt.Sprintf("%s, and %d runs wait already (--admission-max-queued %d)", reason, queued, m)
					if err := c.reject(ctx, e, reason); err != nil {
						return err
					}
					continue
				}
				if err := c.hold(ctx, e, reason, over); err != nil {
					return err
				}
				if e.Policy != Reject {
					queued++
					queuedBy[e.TenantID]++
				}
			}
			continue
		}
		if err := c.start(ctx, e); err != nil {
			if !refusedOne(err) {
				return err // no answer: the runs behind would wait as long
			}
			// Refused for this run: tried again at the next pass, and the
			// later runs of its tenant and plan wait behind it, in order;
			// the other tenants' runs go on.
			blocked["tenant:"+e.TenantID], blocked[plan] = true, true
			failed = append(failed, err)
			continue
		}
		if e.State == stateStarted || e.State == stateStarting {
			total++
			byTenant[e.TenantID]++
			byPlan[planOf(e)]++
		}
	}
	return errors.Join(failed...)
}

// refusedOne tells whether a start that failed, and will be tried again,
// failed for its own run only: Conductor (or a gateway in front of it)
// answered and refused it, or another start of the same run holds its
// lease. A start that got no answer (Conductor, NATS or PostgreSQL away)
// tells nothing good of the next one: the pass stops there.
func refusedOne(err error) bool {
	var ae *adapter.Error
	if errors.As(err, &ae) && ae.Status > 0 {
		return true
	}
	return errors.Is(err, errcode.Conflict) || errors.Is(err, errcode.Forbidden) || errors.Is(err, errcode.Upstream) ||
		errors.Is(err, errcode.NotFound)
}

// recentUnseen is how long a run the decider started may stay out of the
// run list before the decider reads its log to see whether it ended
// (and again, at most as often, while it stays out).
const recentUnseen = 3 * time.Second

// planOf is e's key of the per-plan counts: its tenant's plan.
func planOf(e *entry) [2]string { return [2]string{e.TenantID, e.PlanID} }

// hold answers a pending entry over a limit: rejected, or queued or
// delayed with RunQueued recorded first.
func (c *Controller) hold(ctx context.Context, e *entry, reason string, over int) error {
	key := keyOf(e.RunID)
	if e.Policy == Reject {
		return c.reject(ctx, e, reason)
	}
	// Labels: the run list selects a queued run by them.
	payload := &statestore.RunQueuedPayload{Policy: e.Policy, Reason: reason, RequestedBy: e.RequestedBy, Labels: e.Labels}
	if e.Policy == Delay {
		e.NotBefore = e.SubmittedAt.Add(time.Duration(over) * c.opts.Delay).UTC()
		payload.NotBefore = e.NotBefore.Format(time.RFC3339Nano)
	}
	ev, err := statestore.NewEvent(statestore.RunRef{RunID: e.RunID, TenantID: e.TenantID, ProjectID: e.ProjectID,
		EnvironmentID: e.EnvironmentID, PlanID: e.PlanID, PlanVersion: e.PlanVersion}, statestore.RunQueued, "", 1, 1, payload)
	if err != nil {
		return err
	}
	snap, err := c.opts.Snapshots.ProjectSnapshot(ctx, e.RunID)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return err
	}
	if err := statestore.CheckTransition(snap, ev); err == nil {
		if _, err := c.opts.Log.Emit(ctx, ev); err != nil {
			return err
		}
	}
	e.State, e.Reason, e.QueuedAt = stateQueued, reason, time.Now().UTC()
	if e.Policy == Delay {
		e.State = stateDelayed
	}
	c.opts.Metrics.decided(e.State)
	c.log.Info("run queued", zap.String("runId", e.RunID), zap.String("policy", e.Policy), zap.String("reason", reason))
	return c.put(ctx, key, e)
}

// reject answers a pending entry with a refusal (ADMISSION_REJECTED and
// reason): nothing is recorded in the log.
func (c *Controller) reject(ctx context.Context, e *entry, reason string) error {
	e.State, e.Reason, e.DecidedAt = stateRejected, reason, time.Now().UTC()
	c.opts.Metrics.decided(stateRejected)
	return c.put(ctx, keyOf(e.RunID), e)
}

// start starts e's run: the entry is marked starting first, so that an
// interrupted start is started again, never forgotten; the adapter's
// start is idempotent on the run's request key. A run cancelled while
// queued is not started: RunCancelled is recorded instead.
func (c *Controller) start(ctx context.Context, e *entry) error {
	key := keyOf(e.RunID)
	snap, err := c.opts.Snapshots.ProjectSnapshot(ctx, e.RunID)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return err
	}
	if snap != nil && (snap.CancelRequested || statestore.IsTerminalRunStatus(snap.Status)) {
		return c.cancelQueued(ctx, e, snap)
	}
	was := e.State
	if e.State != stateStarting {
		e.State = stateStarting
		if err := c.put(ctx, key, e); err != nil {
			return err
		}
	}
	var p plan.Plan
	compiled, err := func() (*plan.Compiled, error) {
		if err := json.Unmarshal(e.Plan, &p); err != nil {
			return nil, err
		}
		return plan.Compile(&p)
	}()
	if err != nil {
		return c.notStarted(ctx, e, errcode.New(errcode.Invalid, plan.CodePlanInvalid, "the plan does not compile: "+err.Error()))
	}
	res, err := c.opts.Runs.StartRun(ctx, adapter.StartRequest{TenantID: e.TenantID, ProjectID: e.ProjectID, EnvironmentID: e.EnvironmentID,
		RunRequestID: e.RunRequestID, Plan: compiled, Labels: e.Labels})
	if cannotStart(err) {
		return c.notStarted(ctx, e, err)
	}
	if err != nil {
		err = fmt.Errorf("start run %s: %w", e.RunID, err)
		if refusedOne(err) && was != stateStarting {
			// Not started: it waits again as it did, under the limits.
			e.State = was
			if perr := c.put(ctx, key, e); perr != nil {
				return errors.Join(err, perr)
			}
		}
		return err // retried
	}
	if c.opts.Waker != nil {
		c.opts.Waker.Wake()
	}
	if !e.QueuedAt.IsZero() {
		c.opts.Metrics.waited(time.Since(e.QueuedAt))
	}
	e.State, e.WorkflowID, e.Created, e.DecidedAt = stateStarted, res.Run.WorkflowID, res.Created, time.Now().UTC()
	c.mu.Lock()
	cp := *e
	c.recent[e.RunID] = &cp
	c.mu.Unlock()
	c.opts.Metrics.decided(stateStarted)
	return c.put(ctx, key, e)
}

// cannotStart tells whether a start failed for a reason that trying it
// again does not change: the request or its plan (Invalid), its plan
// version taken by other content (PLAN_VERSION_CONFLICT). Anything else is
// tried again: a dependency away, another start of the run in progress
// (RUN_START_IN_PROGRESS, whose lease ends), a refusal of Conductor's that
// a proxy in front of it may have made.
func cannotStart(err error) bool {
	return errors.Is(err, errcode.Invalid) || errors.Is(err, adapter.ErrPlanConflict)
}

// notStarted ends an entry whose run cannot start, so that it holds up no
// other: a run queued (RunQueued recorded) is cancelled in the log, the
// reason naming why, and the entry is final with the error's code and
// kind, the answer of its waiters and of a repeat of the request.
func (c *Controller) notStarted(ctx context.Context, e *entry, cause error) error {
	snap, err := c.opts.Snapshots.ProjectSnapshot(ctx, e.RunID)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return err
	}
	if snap != nil && (snap.Status == statestore.RunStatusRunning || snap.Status == statestore.RunStatusPaused) {
		// It started (an earlier try of this start got as far as
		// RunStarted): not a run to end here; tried again, as before.
		return fmt.Errorf("start run %s: %w", e.RunID, cause)
	}
	reason := "cannot start: " + cause.Error()
	if snap != nil && !statestore.IsTerminalRunStatus(snap.Status) {
		ev, err := statestore.NewEvent(snap.Ref(), statestore.RunCancelled, "", 1, 1, &statestore.RunCancelledPayload{Reason: reason})
		if err != nil {
			return err
		}
		if err := statestore.CheckTransition(snap, ev); err == nil {
			if _, err := c.opts.Log.Emit(ctx, ev); err != nil {
				return err
			}
		}
	}
	e.State, e.Reason, e.DecidedAt = stateFailed, reason, time.Now().UTC()
	e.FailedCode, e.FailedKind = errcode.CodeOf(cause), errcode.Internal
	if coded, ok := errcode.Of(cause); ok {
		e.FailedKind = coded.ErrorKind()
	}
	c.opts.Metrics.decided(stateFailed)
	c.log.Warn("admission: a run cannot start; its entry is ended", zap.String("runId", e.RunID), zap.String("tenantId", e.TenantID),
		zap.String("code", e.FailedCode), zap.Error(cause))
	return c.put(ctx, keyOf(e.RunID), e)
}

// cancelQueued ends a queued run that was cancelled: RunCancelled (valid
// from QUEUED), and the entry is final.
func (c *Controller) cancelQueued(ctx context.Context, e *entry, snap *statestore.RunSnapshot) error {
	if !statestore.IsTerminalRunStatus(snap.Status) {
		ev, err := statestore.NewEvent(snap.Ref(), statestore.RunCancelled, "", 1, 1, &statestore.RunCancelledPayload{Reason: "cancelled while queued"})
		if err != nil {
			return err
		}
		if err := statestore.CheckTransition(snap, ev); err == nil {
			if _, err := c.opts.Log.Emit(ctx, ev); err != nil {
				return err
			}
		}
	}
	e.State, e.DecidedAt = stateCancelled, time.Now().UTC()
	c.opts.Metrics.decided(stateCancelled)
	return c.put(ctx, keyOf(e.RunID), e)
}

// cleanup removes entries decided more than keepDecided ago.
func (c *Controller) cleanup(ctx context.Context) {
	c.mu.Lock()
	var old []*entry
	for _, e := range c.entries {
		if !e.waiting() && !e.DecidedAt.IsZero() && time.Since(e.DecidedAt) > keepDecided {
			old = append(old, e)
		}
	}
	c.mu.Unlock()
	for _, e := range old {
		_ = c.kv.Delete(ctx, keyOf(e.RunID), jetstream.LastRevision(e.rev))
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
