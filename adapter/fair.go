package adapter

import (
	"context"
	"sync"
)

// callerKey is the context key of WithCaller.
type callerKey struct{}

// WithCaller returns ctx naming who a call to Conductor is made for (an
// API principal): while control calls wait for a place at Conductor, the
// places go to the callers in turn, so that one caller's flood of requests
// does not hold up another's. Calls without a caller (the sidecar's own
// background work, an API without authentication) are one caller.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// CallerOf returns the caller WithCaller named in ctx ("" for none).
func CallerOf(ctx context.Context) string {
	c, _ := ctx.Value(callerKey{}).(string)
	return c
}

// fairPlaces is a counting semaphore whose waiters are served by caller in
// turn (round robin), each caller's own waiters first come first served.
type fairPlaces struct {
	mu      sync.Mutex
	free    int
	waiting map[string][]chan struct{} // per caller, in arrival order
	turns   []string                   // callers with waiters, in turn order
}

func newFairPlaces(n int) *fairPlaces {
	return &fairPlaces{free: n, waiting: map[string][]chan struct{}{}}
}

// tryAcquire takes a place if one is free and nobody waits.
func (f *fairPlaces) tryAcquire() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.free > 0 && len(f.turns) == 0 {
		f.free--
		return true
	}
	return false
}

// acquire takes a place for caller, waiting its turn while ctx lasts.
func (f *fairPlaces) acquire(ctx context.Context, caller string) error {
	f.mu.Lock()
	if f.free > 0 && len(f.turns) == 0 {
		f.free--
		f.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	if len(f.waiting[caller]) == 0 {
		f.turns = append(f.turns, caller)
	}
	f.waiting[caller] = append(f.waiting[caller], ready)
	f.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		f.mu.Lock()
		defer f.mu.Unlock()
		select {
		case <-ready: // handed a place as ctx ended: give it on
			f.handOnLocked()
		default:
			f.dropLocked(caller, ready)
		}
		return ctx.Err()
	}
}

// release gives a place back: to the next caller in turn, if any waits.
func (f *fairPlaces) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handOnLocked()
}

// handOnLocked hands a place to the first waiter of the caller whose turn
// it is (that caller goes to the back of the turns), or frees it.
func (f *fairPlaces) handOnLocked() {
	if len(f.turns) == 0 {
		f.free++
		return
	}
	caller := f.turns[0]
	f.turns = f.turns[1:]
	q := f.waiting[caller]
	close(q[0])
	if len(q) > 1 {
		f.waiting[caller] = q[1:]
		f.turns = append(f.turns, caller)
	} else {
		delete(f.waiting, caller)
	}
}

// dropLocked removes ready, a waiter of caller that gave up.
func (f *fairPlaces) dropLocked(caller string, ready chan struct{}) {
	q := f.waiting[caller]
	for i, c := range q {
		if c == ready {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) > 0 {
		f.waiting[caller] = q
		return
	}
	delete(f.waiting, caller)
	for i, c := range f.turns {
		if c == caller {
			f.turns = append(f.turns[:i:i], f.turns[i+1:]...)
			break
		}
	}
}
