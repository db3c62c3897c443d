package fair

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSemaphore_GivingUpKeepsTheCount: waiters that give up (their
// context ends), some just as a place is handed to them, never take or
// lose a place: after everything is given back, every place is free again
// and a new key gets one at once.
func TestSemaphore_GivingUpKeepsTheCount(t *testing.T) {
	const places = 3
	f := NewSemaphore(places)
	for range places {
		if err := f.Acquire(context.Background(), "held"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	got := make(chan struct{}, 64)
	for i := range 64 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%8)*time.Millisecond)
			defer cancel()
			key := []string{"a", "b", "c"}[i%3]
			if f.Acquire(ctx, key) == nil {
				got <- struct{}{}
				time.Sleep(time.Millisecond)
				f.Release()
			}
		})
	}
	for range places {
		time.Sleep(2 * time.Millisecond)
		f.Release()
	}
	wg.Wait()
	close(got)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.free != places || len(f.turns) != 0 || len(f.waiting) != 0 {
		t.Fatalf("after every waiter left: %d free of %d, %d keys in turn, %d waiting lists", f.free, places, len(f.turns), len(f.waiting))
	}
}

// TestSemaphore_KeysTakeTurns: with one place and keys a (three
// waiting) and b (one waiting, queued after a's), the place goes a, b, a, a.
func TestSemaphore_KeysTakeTurns(t *testing.T) {
	f := NewSemaphore(1)
	if err := f.Acquire(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 4)
	for i, key := range []string{"a", "a", "a", "b"} {
		go func() {
			if err := f.Acquire(context.Background(), key); err == nil {
				order <- key
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); f.waiters() < i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d (%s) did not queue", i, key)
			}
		}
	}
	var got []string
	for range 4 {
		f.Release()
		got = append(got, <-order)
	}
	if want := []string{"a", "b", "a", "a"}; !slices.Equal(got, want) {
		t.Fatalf("places went to %v, want %v", got, want)
	}
}

// waiters counts the waiters of every key.
func (s *Semaphore) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.waiting {
		n += len(q)
	}
	return n
}

// TestSemaphore_PlaceHandedAsTheWaiterGivesUp: a waiter whose context
// ends just as a place is handed to it passes the place on (here, frees
// it): over many tries of the race, no place is ever lost.
func TestSemaphore_PlaceHandedAsTheWaiterGivesUp(t *testing.T) {
	f := NewSemaphore(1)
	for i := range 2000 {
		if err := f.Acquire(context.Background(), "held"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- f.Acquire(ctx, "waiter") }()
		for f.waiters() == 0 {
			time.Sleep(10 * time.Microsecond)
		}
		go cancel()
		f.Release()
		if err := <-done; err == nil {
			f.Release()
		}
		cancel()
		f.mu.Lock()
		free := f.free
		f.mu.Unlock()
		if free != 1 {
			t.Fatalf("try %d: %d places free after everything was given back, want 1", i, free)
		}
	}
}
