package runlist

import (
	"context"
	"sync"
	"time"
)

// StepCounter tells how many steps a plan version has; node wires the
// adapter's plan lookup (a read of the plan's workflow definition from
// Conductor) into it.
type StepCounter interface {
	// StepCount returns the number of steps of tenantID's plan version
	// planID, planVersion (plan ids are each tenant's), or an error when the plan cannot be read. 0 with no
	// error means the plan's steps are not known (a workflow that is not
	// a compiled plan). It may be called concurrently.
	StepCount(ctx context.Context, tenantID, planID, planVersion string) (int, error)
}

// Bounds of the plan step lookups made while listing.
const (
	// planLookupBudget bounds the lookups of one listing: a plan not read
	// by then is listed with its step count unknown.
	planLookupBudget = 3 * time.Second
	// planRetryAfter is how long a plan that could not be read stays
	// unknown before it is looked up again.
	planRetryAfter = 30 * time.Second
	// maxPlanCounts bounds the cache; it starts over beyond.
	maxPlanCounts = 10_000
)

type planKey struct{ tenantID, planID, planVersion string }

// planCount is a cached lookup: the step count, or when it failed.
type planCount struct {
	steps    int
	failedAt time.Time // zero: steps is the answer
}

// planSteps caches each plan version's step count. Plans are immutable,
// so an answer is kept for good; a failure is retried after
// planRetryAfter.
type planSteps struct {
	counter StepCounter

	mu     sync.Mutex
	counts map[planKey]planCount
}

func newPlanSteps(c StepCounter) *planSteps {
	return &planSteps{counter: c, counts: map[planKey]planCount{}}
}

// fill sets PlanSteps on rows, looking up the plan versions not cached
// (within planLookupBudget of ctx).
func (p *planSteps) fill(ctx context.Context, rows []Row) {
	if p == nil || len(rows) == 0 {
		return
	}
	now := time.Now()
	known := map[planKey]int{} // the step counts of rows' plans
	var missing []planKey
	p.mu.Lock()
	for i := range rows {
		k := planKey{rows[i].TenantID, rows[i].PlanID, rows[i].PlanVersion}
		if _, done := known[k]; done {
			continue
		}
		c, ok := p.counts[k]
		known[k] = c.steps
		if !ok || (!c.failedAt.IsZero() && now.Sub(c.failedAt) >= planRetryAfter) {
			missing = append(missing, k)
		}
	}
	p.mu.Unlock()
	if len(missing) > 0 {
		p.lookUp(ctx, missing, known)
	}
	for i := range rows {
		rows[i].PlanSteps = known[planKey{rows[i].TenantID, rows[i].PlanID, rows[i].PlanVersion}]
	}
}

// lookUp reads the step counts of plan versions keys (in order, until
// planLookupBudget ends) into known and the cache.
func (p *planSteps) lookUp(ctx context.Context, keys []planKey, known map[planKey]int) {
	ctx, cancel := context.WithTimeout(ctx, planLookupBudget)
	defer cancel()
	found := make(map[planKey]planCount, len(keys))
	for _, k := range keys {
		if ctx.Err() != nil {
			break // left as they were: a later listing looks them up
		}
		n, err := p.counter.StepCount(ctx, k.tenantID, k.planID, k.planVersion)
		if err != nil {
			if ctx.Err() == nil { // not read, rather than out of time
				found[k] = planCount{failedAt: time.Now()}
			}
			continue
		}
		found[k] = planCount{steps: max(n, 0)}
		known[k] = found[k].steps
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.counts)+len(found) > maxPlanCounts {
		p.counts = map[planKey]planCount{}
	}
	for k, c := range found {
		p.counts[k] = c
	}
}
