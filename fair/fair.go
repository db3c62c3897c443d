// Package fair is a counting semaphore whose waiters take turns by key:
// one key's flood of waiters (an API principal's requests, a task type's
// long polls) makes another key's waiter wait for the next place, not
// behind all of theirs.
package fair

import (
	"context"
	"sync"
)

// Semaphore is a counting semaphore whose waiters wait by key and are
// served key by key in turn (round robin), each key's own waiters first
// come first served. It is safe for concurrent use.
type Semaphore struct {
	mu      sync.Mutex
	free    int
	waiting map[string][]chan struct{} // per key, in arrival order
	turns   []string                   // keys with waiters, in turn order
}

// NewSemaphore returns a Semaphore of n places.
func NewSemaphore(n int) *Semaphore {
	return &Semaphore{free: n, waiting: map[string][]chan struct{}{}}
}

// TryAcquire takes a place if one is free and nobody waits.
func (s *Semaphore) TryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free > 0 && len(s.turns) == 0 {
		s.free--
		return true
	}
	return false
}

// Acquire takes a place for a waiter of key, waiting its turn while ctx
// lasts. A waiter handed a place as ctx ends passes it on.
func (s *Semaphore) Acquire(ctx context.Context, key string) error {
	s.mu.Lock()
	if s.free > 0 && len(s.turns) == 0 {
		s.free--
		s.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	if len(s.waiting[key]) == 0 {
		s.turns = append(s.turns, key)
	}
	s.waiting[key] = append(s.waiting[key], ready)
	s.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		select {
		case <-ready: // handed a place as ctx ended: give it on
			s.handOnLocked()
		default:
			s.dropLocked(key, ready)
		}
		return ctx.Err()
	}
}

// Release gives a place back: to the next key in turn, if any waits.
func (s *Semaphore) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handOnLocked()
}

// handOnLocked hands a place to the first waiter of the key whose turn
// it is (that key goes to the back of the turns), or frees it.
func (s *Semaphore) handOnLocked() {
	if len(s.turns) == 0 {
		s.free++
		return
	}
	key := s.turns[0]
	s.turns = s.turns[1:]
	q := s.waiting[key]
	close(q[0])
	if len(q) > 1 {
		s.waiting[key] = q[1:]
		s.turns = append(s.turns, key)
	} else {
		delete(s.waiting, key)
	}
}

// dropLocked removes ready, a waiter of key that gave up.
func (s *Semaphore) dropLocked(key string, ready chan struct{}) {
	q := s.waiting[key]
	for i, c := range q {
		if c == ready {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) > 0 {
		s.waiting[key] = q
		return
	}
	delete(s.waiting, key)
	for i, c := range s.turns {
		if c == key {
			s.turns = append(s.turns[:i:i], s.turns[i+1:]...)
			break
		}
	}
}
