package adapter

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync"
	"unique"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// runCache mirrors the run index's run entries in memory from a KV watch,
// so that the watcher's scans cost nothing per run in NATS: what changes
// arrives once, as it changes. Entries are read only; every write still
// goes to the index with the entry's revision (compare-and-set), so a
// cache a moment behind costs a retry, never a lost update.
//
// It holds the runs that are not FINAL (a run's entry is dropped when it
// becomes FINAL: the watcher has nothing left to do for it) and keeps them
// sorted by runId, sorting again only when a run comes or goes, so that a
// scan costs nothing per run beyond reading the slice.
type runCache struct {
	mu     sync.Mutex
	runs   map[string]cachedRun
	sorted []cachedRun    // the runs sorted by runId, while !stale
	pos    map[string]int // runId -> index in sorted, while !stale
	stale  bool           // a run came or went since sorted was built
	synced chan struct{}  // closed once the watch delivered the entries that existed
	stop   context.CancelFunc
	done   chan struct{}
}

type cachedRun struct {
	rec *Run
	rev uint64
}

// watchRuns starts the cache's watch of run.> in the index, through
// natsstore.Watch: a watch consumer that stalls is replaced, and the
// cache is not left without the runs created after it stalled.
func (r *Runs) watchRuns(ctx context.Context, log *zap.Logger) (*runCache, error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	kw, err := natsstore.Watch(ctx, r.kv, keyRun+">", log)
	if err != nil {
		cancel()
		return nil, registryUnavailable("watch runs", err)
	}
	c := &runCache{runs: map[string]cachedRun{}, pos: map[string]int{}, synced: make(chan struct{}), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer func() { _ = kw.Stop() }()
		var once sync.Once
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-kw.Updates():
				if !ok {
					return
				}
				if e == nil {
					once.Do(func() { close(c.synced) })
					continue
				}
				c.apply(e, log)
			}
		}
	}()
	return c, nil
}

func (c *runCache) apply(e jetstream.KeyValueEntry, log *zap.Logger) {
	runID := strings.TrimPrefix(e.Key(), keyRun)
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, had := c.runs[runID]
	if had && cur.rev > e.Revision() {
		return
	}
	var rec Run
	keep := e.Operation() == jetstream.KeyValuePut
	if keep {
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.RunID != runID {
			log.Warn("run index entry is not a run; the watcher reads it directly", zap.String("key", e.Key()), zap.Error(err))
			keep = false
		}
	}
	if !keep || rec.State == RunStateFinal {
		if had {
			delete(c.runs, runID)
			c.stale = true
		}
		return
	}
	intern(&rec)
	r := cachedRun{rec: &rec, rev: e.Revision()}
	c.runs[runID] = r
	if !had {
		c.stale = true
	} else if i, ok := c.pos[runID]; ok && !c.stale {
		c.sorted[i] = r
	}
}

// intern makes rec share the strings that repeat across runs (scope,
// plan, workflow, task domain, state, label keys and values) with every
// other entry that has them: the cache holds every open run, paused ones
// included, and decoding an entry allocates each string anew.
func intern(rec *Run) {
	for _, p := range []*string{&rec.TenantID, &rec.ProjectID, &rec.EnvironmentID, &rec.PlanID, &rec.PlanVersion, &rec.PlanHash,
		&rec.WorkflowName, &rec.TaskDomain, &rec.State, &rec.EngineStatus} {
		*p = unique.Make(*p).Value()
	}
	if len(rec.Labels) > 0 {
		m := make(map[string]string, len(rec.Labels))
		for k, v := range rec.Labels {
			m[unique.Make(k).Value()] = unique.Make(v).Value()
		}
		rec.Labels = m
	}
}

// ready reports whether the cache holds every entry that existed when it
// started.
func (c *runCache) ready() bool {
	if c == nil {
		return false
	}
	select {
	case <-c.synced:
		return true
	default:
		return false
	}
}

// open returns the runs that are not FINAL, sorted by runId. The slice is
// the caller's; the entries are shared and must not be changed (apply
// replaces an entry, it never changes one).
func (c *runCache) open() []cachedRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stale || len(c.sorted) != len(c.runs) {
		c.sorted = c.sorted[:0]
		for _, r := range c.runs {
			c.sorted = append(c.sorted, r)
		}
		sort.Slice(c.sorted, func(i, j int) bool { return c.sorted[i].rec.RunID < c.sorted[j].rec.RunID })
		clear(c.pos)
		for i, r := range c.sorted {
			c.pos[r.rec.RunID] = i
		}
		c.stale = false
	}
	return slices.Clone(c.sorted)
}

// workflowIDs returns the set of the workflows the open runs record (nil
// for a nil or unready cache).
func (c *runCache) workflowIDs() map[string]bool {
	if !c.ready() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.runs))
	for _, r := range c.runs {
		if r.rec.WorkflowID != "" {
			out[r.rec.WorkflowID] = true
		}
	}
	return out
}

func (c *runCache) close() {
	if c == nil {
		return
	}
	c.stop()
	<-c.done
}

// runOf returns the open run whose workflow is workflowID (false for a nil
// cache, or none).
func (c *runCache) runOf(workflowID string) (string, bool) {
	if c == nil {
		return "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, r := range c.runs {
		if r.rec.WorkflowID == workflowID {
			return id, true
		}
	}
	return "", false
}
