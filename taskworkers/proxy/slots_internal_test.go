package proxy

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// Slots freed go to the queues that wait in turn, each queue's requests in
// their order: with one slot held, a queue of three and then a queue of
// one waiting, the second queue's request is let in second, not fourth.
func TestUpstreamSlots_QueuesTakeTurns(t *testing.T) {
	s := newUpstreamSlots("poll", 1, nil)
	if err := s.acquire(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	// wait sends a request of queue, named name, and returns once it is
	// in line, the inLine-th of its queue.
	wait := func(queue, name string, inLine int) {
		wg.Go(func() {
			if err := s.acquire(context.Background(), queue); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			s.release()
		})
		for {
			s.mu.Lock()
			n := len(s.waiting[queue])
			s.mu.Unlock()
			if n == inLine {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	wait("a", "a1", 1)
	wait("a", "a2", 2)
	wait("a", "a3", 3)
	wait("b", "b1", 1)
	s.release()
	wg.Wait()
	if want := []string{"a1", "b1", "a2", "a3"}; !slices.Equal(order, want) {
		t.Fatalf("let in %v, want %v", order, want)
	}
}

// Requests that give up while they wait, some just as a slot is given to
// them, lose no slot: once every request is done, every slot is free
// again and no queue is left.
func TestUpstreamSlots_GivingUpLosesNoSlot(t *testing.T) {
	const n = 3
	s := newUpstreamSlots("poll", n, nil)
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(300))*time.Microsecond)
			defer cancel()
			if s.acquire(ctx, []string{"a", "b", "c", "d"}[i%4]) == nil {
				time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
				s.release()
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free != n || len(s.waiting) != 0 || len(s.turns) != 0 {
		t.Fatalf("after every request: %d free (want %d), %d queues waiting, turns %v", s.free, n, len(s.waiting), s.turns)
	}
}
