package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// UnansweredCalls checks that each of calls fails with an error matching
// want within patience while the server does not answer, whatever its
// caller's deadline: each runs twice, in parallel subtests, without a
// deadline and with one an hour away (a step's can be). A call gets the
// subtest's deadline as name, for a key of its own. The caller makes the
// server stop answering before, and lets it answer again in a t.Cleanup
// (which runs after the parallel subtests).
func UnansweredCalls(t *testing.T, calls map[string]func(ctx context.Context, name string) error, want error, patience time.Duration) {
	t.Helper()
	for name, call := range calls {
		for _, deadline := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%s, deadline %v", name, deadline), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				if deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, deadline)
					defer cancel()
				}
				done := make(chan error, 1)
				go func() { done <- call(ctx, deadline.String()) }()
				select {
				case err := <-done:
					if !errors.Is(err, want) {
						t.Fatalf("a call the server never answered: %v, want %v", err, want)
					}
				case <-time.After(patience):
					t.Fatalf("a call the server never answered still waits after %v", patience)
				}
			})
		}
	}
}
