package exec

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

func TestCapture_Bytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, max := range []int{1, 2, 7, 100, 1000} {
		for _, total := range []int{0, 1, max / 2, max - 1, max, max + 1, 3*max + 5, 10 * max} {
			t.Run(fmt.Sprintf("max%d/total%d", max, total), func(t *testing.T) {
				data := make([]byte, total)
				for i := range data {
					data[i] = 'a' + byte(rng.IntN(26))
				}
				c := newCapture(max)
				for rest := data; len(rest) > 0; {
					n := min(len(rest), 1+rng.IntN(2*max))
					if k, err := c.Write(rest[:n]); k != n || err != nil {
						t.Fatalf("write: %d, %v", k, err)
					}
					rest = rest[n:]
				}
				got, n, trunc := c.bytes(nil)
				if n != int64(total) {
					t.Fatalf("total %d want %d", n, total)
				}
				if total <= max {
					if trunc || !bytes.Equal(got, data) {
						t.Fatalf("got %q (trunc %v) want %q", got, trunc, data)
					}
					return
				}
				h := max / 2
				want := append(append(append([]byte{}, data[:h]...), fmt.Sprintf("\n[... %d bytes omitted ...]\n", total-max)...), data[total-(max-h):]...)
				if !trunc || !bytes.Equal(got, want) {
					t.Fatalf("got %q want %q", got, want)
				}
			})
		}
	}
	t.Run("SecretAcrossTheCut", func(t *testing.T) {
		c := newCapture(20)
		c.Write([]byte("0123456SECRET-VALUE-abcdefghijklmnopqrstuvwxyz-SECRET-VALUE"))
		got, _, _ := c.bytes(secrets.NewRedactor("SECRET-VALUE"))
		for _, frag := range []string{"SECR", "VALUE", "ET-"} {
			if bytes.Contains(got, []byte(frag)) {
				t.Errorf("got %q: a piece of the secret survives the cut", got)
			}
		}
	})
}

type panicky struct{}

func (panicky) Execute(context.Context, taskworkers.Execution) (taskworkers.Result, error) {
	var m map[string]int
	m["x"]++ // a bug
	return taskworkers.Result{}, nil
}

func TestGuarded_Execute(t *testing.T) {
	g := guarded{panicky{}, zaptest.NewLogger(t)}
	res, err := g.Execute(context.Background(), taskworkers.Execution{Spec: plan.ExecutorSpec{Type: "x"}})
	if err != nil || res.Err == nil || res.Err.Code != CodeInternal || res.Err.Retryable {
		t.Fatalf("got %+v, %v", res.Err, err)
	}
}
