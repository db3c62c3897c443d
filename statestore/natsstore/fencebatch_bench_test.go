package natsstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// BenchmarkFencedStartsOfOneRun measures what a batch of k starts of one
// run costs when each must be conditional on the run's last runSeq (the
// fence), three ways, on a stream configured as the event log's (one
// message per subject, discard new per subject) with atomic publish
// allowed, on one embedded server per fsync mode:
//
//   - serial: k conditional publishes, each on the sequence the one before
//     got (what the gate does today, one StepStarted after another);
//   - atomic: one atomic batch (nats-server 2.12+) of k messages, the
//     first carrying the run's expected last sequence for the run's
//     subject filter: the whole batch stored or none of it;
//   - pipelined: k conditional publishes sent without waiting, each on
//     the sequence the one before will get.
//
// One op is one batch of k = 8. BENCHMARKS.md, "Where a gated task's time
// goes".
func BenchmarkFencedStartsOfOneRun(b *testing.B) {
	const k = 8
	for _, mode := range syncModes {
		b.Run(mode.name, func(b *testing.B) {
			srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: b.TempDir(), Port: -1, DontListen: true,
				SyncAlways: mode.interval == 0, SyncInterval: mode.interval, NoLog: true, NoSigs: true})
			if err != nil {
				b.Fatal(err)
			}
			srv.Start()
			defer srv.Shutdown()
			if !srv.ReadyForConnections(10 * time.Second) {
				b.Fatal("server not ready")
			}
			nc, err := nats.Connect("", nats.InProcessServer(srv))
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx := context.Background()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FENCE", Subjects: []string{"f.>"}, MaxMsgs: -1, MaxBytes: -1,
				MaxMsgsPerSubject: 1, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, AllowDirect: true,
				Storage: jetstream.FileStorage, AllowAtomicPublish: true}); err != nil {
				b.Fatal(err)
			}
			f := &fencedRun{b: b, js: js, nc: nc, body: make([]byte, 600)}
			f.serial(2) // the run exists
			// The fence holds for a batch: one whose first message names a
			// stale last sequence of the run is refused whole.
			stale, stored := f.last, f.last
			f.last = stale - 1
			if ack := f.commit(k); !strings.Contains(ack, `"err_code":10071`) {
				b.Fatalf("a batch on a stale sequence: %s, want wrong last sequence (10071)", ack)
			}
			f.last = stored
			if info, err := js.Stream(ctx, "FENCE"); err != nil || info.CachedInfo().State.LastSeq != stored {
				b.Fatalf("a refused batch stored something: %v", err)
			}
			for _, way := range []struct {
				name string
				do   func(int)
			}{{"serial", f.serial}, {"atomic", f.atomic}, {"pipelined", f.pipelined}} {
				b.Run(way.name, func(b *testing.B) {
					f.b = b
					for i := 0; i < b.N; i++ {
						way.do(k)
					}
				})
			}
		})
	}
}

// fencedRun publishes a run's events on f.run.<n>, each batch conditional
// on last, the run's last sequence.
type fencedRun struct {
	b    *testing.B
	js   jetstream.JetStream
	nc   *nats.Conn
	body []byte
	last uint64
	n    int
}

func (f *fencedRun) msg(expect uint64, fence bool) *nats.Msg {
	f.n++
	m := nats.NewMsg("f.run." + strconv.Itoa(f.n))
	m.Data = f.body
	if fence {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
		m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, "f.run.>")
	}
	return m
}

func (f *fencedRun) serial(k int) {
	for i := 0; i < k; i++ {
		ack, err := f.js.PublishMsg(context.Background(), f.msg(f.last, true))
		if err != nil {
			f.b.Fatal(err)
		}
		f.last = ack.Sequence
	}
}

func (f *fencedRun) atomic(k int) {
	var ack struct {
		Seq   uint64 `json:"seq"`
		Count int    `json:"count"`
	}
	resp := f.commit(k)
	if err := json.Unmarshal([]byte(resp), &ack); err != nil || ack.Count != k {
		f.b.Fatalf("atomic batch: %s", resp)
	}
	f.last = ack.Seq
}

// commit publishes one atomic batch of k messages, the first fenced on
// f.last, and returns the server's answer to its commit.
func (f *fencedRun) commit(k int) string {
	id := fmt.Sprintf("batch-%d", f.n)
	for i := 0; i < k; i++ {
		m := f.msg(f.last, i == 0)
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < k-1 {
			if err := f.nc.PublishMsg(m); err != nil {
				f.b.Fatal(err)
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		resp, err := f.nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			f.b.Fatal(err)
		}
		return string(resp.Data)
	}
	return ""
}

func (f *fencedRun) pipelined(k int) {
	futs := make([]jetstream.PubAckFuture, 0, k)
	for i := 0; i < k; i++ {
		fut, err := f.js.PublishMsgAsync(f.msg(f.last+uint64(i), true))
		if err != nil {
			f.b.Fatal(err)
		}
		futs = append(futs, fut)
	}
	for _, fut := range futs {
		select {
		case ack := <-fut.Ok():
			f.last = ack.Sequence
		case err := <-fut.Err():
			f.b.Fatal(err)
		}
	}
}

// BenchmarkGatedTaskWrites measures the floor of a gated task's added
// latency: its two writes through the producer's path (the registry's
// eventId, then the append), StepStarted conditional on the run's last
// runSeq and StepCompleted after it, on a run of its own, each op one
// task, on the embedded server with the serve default (fsync on every
// write). It reports the p50 and p90 of a task's two writes and of each
// alone.
func BenchmarkGatedTaskWrites(b *testing.B) {
	ctx := context.Background()
	js, _ := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{})
	store, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		b.Fatal(err)
	}
	emit := registry.NewEmitter(ids, store)
	var started, completed, both []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ref := statestore.RunRef{RunID: fmt.Sprintf("floor-%d-%d", time.Now().UnixNano(), i), TenantID: "t", ProjectID: "p",
			EnvironmentID: "e", PlanID: "plan", PlanVersion: "1"}
		rs, err := statestore.NewEvent(ref, statestore.RunStarted, "", 1, 1, statestore.RunStartedPayload{
			EngineRunRef: "conductor://w/" + ref.RunID, EngineType: "conductor", StartedAt: time.Now().UTC().Format(time.RFC3339Nano)})
		if err != nil {
			b.Fatal(err)
		}
		res, err := emit.Emit(ctx, rs)
		if err != nil {
			b.Fatal(err)
		}
		ss, _ := statestore.NewEvent(ref, statestore.StepStarted, "s1", 1, 1, nil)
		sc, _ := statestore.NewEvent(ref, statestore.StepCompleted, "s1", 1, 1, statestore.StepCompletedPayload{})
		b.StartTimer()
		began := time.Now()
		if _, err := emit.EmitIf(ctx, ss, res.RunSeq); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if _, err := emit.Emit(ctx, sc); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		started, completed, both = append(started, mid.Sub(began)), append(completed, end.Sub(mid)), append(both, end.Sub(began))
	}
	b.StopTimer()
	q := func(d []time.Duration, p int) float64 {
		slices.Sort(d)
		return float64(d[(len(d)-1)*p/100].Microseconds()) / 1000
	}
	b.ReportMetric(q(both, 50), "p50-ms/task")
	b.ReportMetric(q(both, 90), "p90-ms/task")
	b.ReportMetric(q(started, 50), "p50-ms/StepStarted")
	b.ReportMetric(q(completed, 50), "p50-ms/StepCompleted")
}
