package membership_test

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// BenchmarkOwns: what a scan pays per run to know whether it is this
// replica's, with three live replicas.
func BenchmarkOwns(b *testing.B) {
	_, srv := natstest.Start(b)
	opts := membership.Options{Heartbeat: 20 * time.Millisecond, DeadAfter: time.Minute}
	var ms []*membership.Members
	for range 3 {
		m, err := membership.Open(context.Background(), natstest.Connect(b, srv), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close(context.Background()) })
		ms = append(ms, m)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if keys, all := ms[0].Live(); len(keys) == 3 && !all {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the members never saw each other")
		}
		time.Sleep(5 * time.Millisecond)
	}
	owned := 0
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if ms[0].Owns(runIDs[i%len(runIDs)]) {
			owned++
		}
	}
	b.ReportMetric(float64(owned)/float64(b.N), "owned/op")
}
