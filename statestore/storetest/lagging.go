package storetest

import (
	"context"
	"sync"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// SnapshotReader reads a run's state (statestore.Projector, a store).
type SnapshotReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
}

// LaggingReads answers every read of a run, but one that must see every
// append (statestore.WithLatest), with the first state it read of it: a
// JetStream replica behind its leader, as during a leader election. A
// fake of that moment: a real cluster lags only for moments nobody can
// choose.
type LaggingReads struct {
	inner SnapshotReader
	mu    sync.Mutex
	first map[string]*statestore.RunSnapshot
}

// NewLaggingReads returns LaggingReads of inner.
func NewLaggingReads(inner SnapshotReader) *LaggingReads {
	return &LaggingReads{inner: inner, first: map[string]*statestore.RunSnapshot{}}
}

// ProjectSnapshot implements SnapshotReader.
func (l *LaggingReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if statestore.Latest(ctx) {
		return l.inner.ProjectSnapshot(ctx, runID)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.first[runID]; ok {
		return s, nil
	}
	s, err := l.inner.ProjectSnapshot(ctx, runID)
	if err == nil {
		l.first[runID] = s
	}
	return s, err
}
