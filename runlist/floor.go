package runlist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// keyFloor is the key of the list's floor.
const keyFloor = "floor"

// floor lets a replica start without reading every row of the bucket. It
// says: every open run's row, and every finished run's row before the
// position (Created, RunID) in the list's order, has a revision at or
// above Seq. A replica that starts reads the bucket from Seq on (plus the
// few keys that are not rows), and knows that every finished row it did
// not read is at or beyond the position: in the bucket only, where a
// listing that reaches the position reads it, as for the rows a window
// let go. Rows only ever get newer revisions and a run's position never
// changes, so a floor once true stays true.
//
// The list's follower writes it from its replica's window (Seq: the
// lowest revision among the finished rows kept; the position: the
// window's bound), after rewriting unchanged the rows of open runs below
// Seq, each time the bucket moved by half a window since its last floor.
type floor struct {
	Seq     uint64 `json:"seq"`
	Created int64  `json:"c"`
	RunID   string `json:"r"`
}

// readFloor returns the bucket's floor, nil when there is none (a list
// that never let a finished row go) or it does not parse.
func (mr *mirror) readFloor(ctx context.Context) (*floor, error) {
	e, err := mr.kv.Get(ctx, keyFloor)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, nil
	case err != nil:
		return nil, err
	}
	var fl floor
	if err := json.Unmarshal(e.Value(), &fl); err != nil || fl.Seq == 0 || statestore.CheckID(fl.RunID, true) != nil {
		mr.log.Warn("run list: the floor does not parse; reading every row", zap.ByteString("floor", e.Value()))
		return nil, nil
	}
	return &fl, nil
}

// readKeys applies to st the keys of the bucket that are not rows (the
// cursor, step durations), whatever their revision.
func (mr *mirror) readKeys(ctx context.Context, st *state) error {
	kw, err := mr.kv.WatchFiltered(ctx, []string{keyCursor, keyDur + ">"})
	if err != nil {
		return err
	}
	defer func() { _ = kw.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e == nil {
				return nil
			}
			st.apply(e, mr.log)
		}
	}
}

// floorNow is the floor this replica's mirror can vouch for, and the keys
// of the open runs' rows below it (to rewrite first); ok is false when
// the mirror's revision is below minRev (nothing is looked at), it has
// let no finished row go (no floor needed) or it is not synced.
func (mr *mirror) floorNow(minRev uint64) (fl floor, below []string, rev uint64, ok bool) {
	mr.mu.RLock()
	defer mr.mu.RUnlock()
	st := &mr.st
	if !mr.synced || st.rev < minRev || st.bound == nil || len(st.heap) == 0 {
		return fl, nil, st.rev, false
	}
	fl.Seq = st.heap[0].rev
	for _, e := range st.heap {
		fl.Seq = min(fl.Seq, e.rev)
	}
	fl.Created, fl.RunID = st.bound.created, st.bound.row.RunID
	for id, e := range st.rows {
		if e.finIndex < 0 && e.rev < fl.Seq {
			below = append(below, keyRun+natsstore.RunToken(id))
		}
	}
	return fl, below, st.rev, true
}

// maybeFloor writes a new floor once the bucket moved by half a window
// since the last one: it rewrites, unchanged, the open runs' rows below
// the new floor, then the floor.
func (f *follower) maybeFloor(ctx context.Context) error {
	step := uint64(max(1, f.opts.MaxFinished/2))
	fl, below, rev, ok := f.mirror.floorNow(f.floorRev + step)
	if !ok || fl.Seq <= f.floorSeq {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	for _, key := range below {
		e, err := f.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			continue
		case err != nil:
			return fmt.Errorf("%w: read %s: %w", ErrUnavailable, key, err)
		case e.Revision() >= fl.Seq:
			continue
		}
		// A lost compare-and-set: the row was written since, above the floor.
		if _, err := f.kv.Update(ctx, key, e.Value(), e.Revision()); err != nil && !conflict(err) {
			return fmt.Errorf("%w: rewrite %s: %w", ErrUnavailable, key, err)
		}
	}
	b, _ := json.Marshal(fl)
	if _, err := f.kv.Put(ctx, keyFloor, b); err != nil {
		return fmt.Errorf("%w: write the floor: %w", ErrUnavailable, err)
	}
	f.floorSeq, f.floorRev = fl.Seq, rev
	return nil
}
