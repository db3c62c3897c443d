package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// batchInFlight bounds the registry writes (JetStream KV) and the runs
// appended one at a time (a store without AppendBatch) that one EmitBatch
// has in flight together.
const batchInFlight = 32

// EmitBatch is EmitIf for many runs at once, for bulk control: each
// RunBatch's events are validated, get their registry-stable eventIds,
// and are appended with the store's AppendBatch (statestore.BatchAppender)
// on the condition that the run's last runSeq is its LastSeq; a store
// without AppendBatch gets each run's events one after the other. The
// answer is the store's, per run (statestore.BatchAppender.AppendBatch):
// a run that moved on gets an error matching statestore.ErrRunChanged and
// its registered eventIds stay for the next try; an invalid event answers
// its run with the *statestore.Error and touches neither the registry nor
// the store. An eventId the store answers differently is adopted as Emit
// adopts it; an adopt that fails is the run's error, with its results.
//
// The eventIds of a batch are registered together: on PostgreSQL in one
// pipelined round trip and one commit, on JetStream KV batchInFlight
// creates in flight.
func (e *Emitter) EmitBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	out := make([]statestore.BatchResult, len(runs))
	var keys []pendingID
	for i, b := range runs {
		if err := checkProbe(b); err != nil {
			out[i].Err = fmt.Errorf("registry: emit: %w", err)
			continue
		}
		for _, w := range b.Events {
			keys = append(keys, pendingID{run: i, w: w})
		}
	}
	e.reg.eventIDs(ctx, keys)
	var send []int
	for _, k := range keys {
		if k.err != nil && out[k.run].Err == nil {
			out[k.run].Err = fmt.Errorf("registry: emit: %w", k.err)
		}
		k.w.EventID = k.id
	}
	for i := range runs {
		if out[i].Err == nil {
			send = append(send, i)
		}
	}
	if len(send) == 0 {
		return out
	}
	in := make([]statestore.RunBatch, len(send))
	for j, i := range send {
		in[j] = runs[i]
	}
	var got []statestore.BatchResult
	if b, ok := e.app.(statestore.BatchAppender); ok {
		got = b.AppendBatch(ctx, in)
	} else {
		got = e.appendEach(ctx, in)
	}
	for j, i := range send {
		r := got[j]
		if r.Err != nil {
			r.Err = fmt.Errorf("registry: emit: append: %w", r.Err)
		}
		for k, res := range r.Results {
			w := runs[i].Events[k]
			if res.EventID == w.EventID {
				continue
			}
			w.EventID = res.EventID
			if err := e.reg.Adopt(ctx, w.RunID, w.IdempotencyKey, res.EventID); err != nil && r.Err == nil {
				r.Err = fmt.Errorf("registry: emit: appended with eventId %s, adopt failed: %w", res.EventID, err)
			}
		}
		out[i] = r
	}
	return out
}

// checkProbe validates a run's batch as Emit validates one event, before
// its eventIds exist.
func checkProbe(b statestore.RunBatch) error {
	probe := statestore.RunBatch{LastSeq: b.LastSeq, Events: make([]*statestore.RunEventWrite, len(b.Events))}
	for i, w := range b.Events {
		if w == nil {
			return fmt.Errorf("%w: event is nil", ErrInvalidInput)
		}
		p := *w
		p.EventID = placeholderEventID
		probe.Events[i] = &p
	}
	return statestore.CheckBatch(probe)
}

// appendEach is AppendBatch for a store without it: each run's events
// with AppendIf, one after the other, batchInFlight runs at a time.
func (e *Emitter) appendEach(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	out := make([]statestore.BatchResult, len(runs))
	each(len(runs), func(i int) {
		last := max(runs[i].LastSeq, 0)
		for _, w := range runs[i].Events {
			res, err := e.app.AppendIf(ctx, w, last)
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].Results = append(out[i].Results, res)
			if res.Persisted {
				last = res.RunSeq
			}
		}
	})
	return out
}

// pendingID is one event's eventId to register: id, or err.
type pendingID struct {
	run int
	w   *statestore.RunEventWrite
	id  string
	err error
}

// batchEntries is an optional capability of entries: getOrCreate of many
// keys at once.
type batchEntries interface {
	getOrCreateMany(ctx context.Context, keys []pendingID, fresh []string)
}

// eventIDs sets the id (or err) of every key, as EventID would.
func (r *Registry) eventIDs(ctx context.Context, keys []pendingID) {
	start := time.Now()
	fresh := make([]string, len(keys))
	for i := range keys {
		u, err := uuid.NewRandom()
		if err != nil {
			keys[i].err = fmt.Errorf("registry: generate eventId: %w", err)
			continue
		}
		fresh[i] = u.String()
		if _, err := Key(keys[i].w.RunID, keys[i].w.IdempotencyKey); err != nil {
			keys[i].err = err
		}
	}
	if b, ok := r.entries.(batchEntries); ok {
		b.getOrCreateMany(ctx, keys, fresh)
	} else {
		each(len(keys), func(i int) {
			k := &keys[i]
			if k.err == nil {
				key, _ := Key(k.w.RunID, k.w.IdempotencyKey)
				k.id, _, k.err = r.entries.getOrCreate(ctx, k.w.RunID, k.w.IdempotencyKey, key, fresh[i])
			}
		})
	}
	for i, k := range keys {
		result := resultFound
		switch {
		case k.err != nil:
			result = resultError
		case k.id == fresh[i]:
			result = resultCreated
		}
		r.metrics.observe(opGetOrCreate, result, start)
	}
}

// getOrCreateMany sends every key's insertOrGet in one pipelined batch,
// one implicit transaction and one commit; a key whose row a racing
// producer committed meanwhile is read again on its own.
func (p *pgEntries) getOrCreateMany(ctx context.Context, keys []pendingID, fresh []string) {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	batch := &pgx.Batch{}
	var sent []int
	for i, k := range keys {
		if k.err == nil {
			sent = append(sent, i)
			batch.Queue(insertOrGet, k.w.RunID, k.w.IdempotencyKey, fresh[i])
		}
	}
	if len(sent) == 0 {
		return
	}
	br := p.pool.SendBatch(ctx, batch)
	var failed error
	for _, i := range sent {
		k := &keys[i]
		if failed != nil {
			k.err = failed
			continue
		}
		var created bool
		err := br.QueryRow().Scan(&k.id, &created)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			k.id = "" // read below, after the batch
		case err != nil:
			key, _ := Key(k.w.RunID, k.w.IdempotencyKey)
			failed = pgUnavailable("get or create", key, err)
			k.err = failed
		}
	}
	if err := br.Close(); err != nil && failed == nil {
		for _, i := range sent {
			key, _ := Key(keys[i].w.RunID, keys[i].w.IdempotencyKey)
			keys[i].id, keys[i].err = "", pgUnavailable("get or create", key, err)
		}
		return
	}
	for _, i := range sent {
		k := &keys[i]
		if k.err == nil && k.id == "" {
			key, _ := Key(k.w.RunID, k.w.IdempotencyKey)
			k.id, _, k.err = p.getOrCreate(ctx, k.w.RunID, k.w.IdempotencyKey, key, fresh[i])
		}
	}
}

// each calls f(0..n-1), batchInFlight at a time, and returns when every
// call has.
func each(n int, f func(i int)) {
	var g errgroup.Group
	g.SetLimit(batchInFlight)
	for i := range n {
		g.Go(func() error { f(i); return nil })
	}
	_ = g.Wait() // f returns no error
}
