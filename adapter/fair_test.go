package adapter

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestFairPlaces_GivingUpKeepsTheCount: waiters that give up (their
// context ends), some just as a place is handed to them, never take or
// lose a place: after everything is given back, every place is free again
// and a new caller gets one at once.
func TestFairPlaces_GivingUpKeepsTheCount(t *testing.T) {
	const places = 3
	f := newFairPlaces(places)
	for range places {
		if err := f.acquire(context.Background(), "held"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	got := make(chan struct{}, 64)
	for i := range 64 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%8)*time.Millisecond)
			defer cancel()
			caller := []string{"a", "b", "c"}[i%3]
			if f.acquire(ctx, caller) == nil {
				got <- struct{}{}
				time.Sleep(time.Millisecond)
				f.release()
			}
		})
	}
	for range places {
		time.Sleep(2 * time.Millisecond)
		f.release()
	}
	wg.Wait()
	close(got)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.free != places || len(f.turns) != 0 || len(f.waiting) != 0 {
		t.Fatalf("after every waiter left: %d free of %d, %d callers in turn, %d waiting lists", f.free, places, len(f.turns), len(f.waiting))
	}
}

// TestFairPlaces_CallersTakeTurns: with one place and callers a (three
// waiting) and b (one waiting, queued after a's), the place goes a, b, a, a.
func TestFairPlaces_CallersTakeTurns(t *testing.T) {
	f := newFairPlaces(1)
	if err := f.acquire(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 4)
	for i, caller := range []string{"a", "a", "a", "b"} {
		go func() {
			if err := f.acquire(context.Background(), caller); err == nil {
				order <- caller
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); f.waiters() < i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d (%s) did not queue", i, caller)
			}
		}
	}
	var got []string
	for range 4 {
		f.release()
		got = append(got, <-order)
	}
	if want := []string{"a", "b", "a", "a"}; !slices.Equal(got, want) {
		t.Fatalf("places went to %v, want %v", got, want)
	}
}

// waiters counts the waiters of every caller.
func (f *fairPlaces) waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, q := range f.waiting {
		n += len(q)
	}
	return n
}

// TestFairPlaces_PlaceHandedAsTheWaiterGivesUp: a waiter whose context
// ends just as a place is handed to it passes the place on (here, frees
// it): over many tries of the race, no place is ever lost.
func TestFairPlaces_PlaceHandedAsTheWaiterGivesUp(t *testing.T) {
	f := newFairPlaces(1)
	for i := range 2000 {
		if err := f.acquire(context.Background(), "held"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- f.acquire(ctx, "waiter") }()
		for f.waiters() == 0 {
			time.Sleep(10 * time.Microsecond)
		}
		go cancel()
		f.release()
		if err := <-done; err == nil {
			f.release()
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
