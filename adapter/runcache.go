package adapter

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// runCache mirrors the run index's run entries in memory from a KV watch,
// so that the watcher's scans cost nothing per run in NATS: what changes
// arrives once, as it changes. Entries are read only; every write still
// goes to the index with the entry's revision (compare-and-set), so a
// cache a moment behind costs a retry, never a lost update.
type runCache struct {
	mu     sync.Mutex
	runs   map[string]cachedRun
	synced chan struct{} // closed once the watch delivered the entries that existed
	stop   context.CancelFunc
	done   chan struct{}
}

type cachedRun struct {
	rec *Run
	rev uint64
}

// watchRuns starts the cache's watch of run.> in the index.
func (r *Runs) watchRuns(ctx context.Context, log *zap.Logger) (*runCache, error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	kw, err := r.kv.Watch(ctx, keyRun+">")
	if err != nil {
		cancel()
		return nil, registryUnavailable("watch runs", err)
	}
	c := &runCache{runs: map[string]cachedRun{}, synced: make(chan struct{}), stop: cancel, done: make(chan struct{})}
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
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.runs, runID)
		return
	}
	var rec Run
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.RunID != runID {
		log.Warn("run index entry is not a run; the watcher reads it directly", zap.String("key", e.Key()), zap.Error(err))
		delete(c.runs, runID)
		return
	}
	if cur, ok := c.runs[runID]; ok && cur.rev > e.Revision() {
		return
	}
	c.runs[runID] = cachedRun{rec: &rec, rev: e.Revision()}
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

// open returns the runs that are not FINAL, with copies of their entries.
func (c *runCache) open() []cachedRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]cachedRun, 0, len(c.runs))
	for _, r := range c.runs {
		if r.rec.State != RunStateFinal {
			rec := *r.rec
			out = append(out, cachedRun{rec: &rec, rev: r.rev})
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
