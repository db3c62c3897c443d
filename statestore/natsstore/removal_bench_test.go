package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// BenchmarkRemover removes finished 4-record runs (with a snapshot and 4
// event-id keys each) from a removable store on an embedded server that
// fsyncs every write (the sidecar's default) or every 2 minutes, one run
// per RemoveRuns
// ("one-at-a-time": a ledger write before and after each run, its purges
// in sequence) or a retention segment's worth per call ("segment": batches
// of RemoveBatchRuns runs). The two alternate per round on the same
// server; -benchtime=Nx sets the rounds. Reports runs removed a second.
//
//	go test -run '^$' -bench BenchmarkRemover -benchtime 6x ./statestore/natsstore/
//
// "window=N" appends N records of later runs after each round's runs (what
// retention's window keeps after the runs it removes): what removing a run
// costs should not grow with them.
func BenchmarkRemover(b *testing.B) {
	for _, sm := range syncModes {
		b.Run(sm.name, func(b *testing.B) { benchRemover(b, sm.interval, 0) })
	}
	if !testing.Short() {
		b.Run("sync=2m/window=20000", func(b *testing.B) { benchRemover(b, 2*time.Minute, 20000) })
	}
}

func benchRemover(b *testing.B, syncInterval time.Duration, window int) {
	const perRound = 200 // retention.DefaultBatchRuns
	ctx := context.Background()
	js, srv := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{Logger: zap.NewNop(), SyncInterval: syncInterval,
		RetentionPermissions: natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, natsstore.DefaultSnapshotBucket, idsBucket)})
	s, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true, Logger: zap.NewNop(), SnapshotBucket: natsstore.DefaultSnapshotBucket})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: idsBucket})
	if err != nil {
		b.Fatal(err)
	}
	nc, err := srv.ConnectRetention()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	rjs, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	r, err := natsstore.OpenRemover(ctx, rjs, natsstore.RemoverOptions{Logger: zap.NewNop(), RunKeys: []natsstore.RunKeys{
		{Bucket: natsstore.DefaultSnapshotBucket, Keys: natsstore.RunKey}, {Bucket: idsBucket, Keys: natsstore.RunKeyPrefix},
	}})
	if err != nil {
		b.Fatal(err)
	}
	next := 0
	// fill appends perRound finished runs and returns their removals.
	fill := func() []statestore.Removal {
		var out []statestore.Removal
		for range perRound {
			id := fmt.Sprintf("bench-%d", next)
			next++
			var last int64
			for _, w := range []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s"), storetest.Event(id, statestore.StepCompleted, "s"), storetest.Event(id, statestore.RunCompleted, "")} {
				res, err := s.Append(ctx, w)
				if err != nil {
					b.Fatal(err)
				}
				last = res.RunSeq
				if _, err := ids.PutString(ctx, natsstore.RunToken(id)+"."+w.EventID, "x"); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.ProjectSnapshot(ctx, id); err != nil { // terminal: saved
				b.Fatal(err)
			}
			out = append(out, statestore.Removal{RunID: id, LastRunSeq: uint64(last), Records: 4})
		}
		for i := range window {
			if _, err := s.Append(ctx, storetest.Event(fmt.Sprintf("later-%d-%d", next, i), statestore.RunStarted, "")); err != nil {
				b.Fatal(err)
			}
		}
		return out
	}
	var took [2]time.Duration
	var runs [2]int
	for b.Loop() {
		for mode := range 2 {
			b.StopTimer()
			rs := fill()
			b.StartTimer()
			began := time.Now()
			if mode == 0 {
				for _, rm := range rs {
					if err := r.RemoveRuns(ctx, []statestore.Removal{rm}); err != nil {
						b.Fatal(err)
					}
				}
			} else if err := r.RemoveRuns(ctx, rs); err != nil {
				b.Fatal(err)
			}
			took[mode] += time.Since(began)
			runs[mode] += len(rs)
		}
	}
	if err := s.Check(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(runs[0])/took[0].Seconds(), "one-at-a-time-runs/s")
	b.ReportMetric(float64(runs[1])/took[1].Seconds(), "segment-runs/s")
}
