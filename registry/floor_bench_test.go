package registry_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// floorConcurrency is serve's default noop worker concurrency: the number
// of steps the floor runs at once; 1 is the idle floor (the gate's).
var floorConcurrency = []int{16, 1}

// floorChain is the number of steps of one run before a worker goes on to
// a fresh run (bench/steps runs 10-step chains).
const floorChain = 10

// BenchmarkStepFloor is the log's floor under a step: per step exactly the
// writes the Run Events Contract asks of it and nothing else, two registry
// entries (StepStarted's and StepCompleted's eventId) and two appends,
// each conditioned on the run's last runSeq (the fence: StepStarted on the
// run as it was, StepCompleted on StepStarted's runSeq), floorConcurrency
// steps at once (and one at a time: the idle floor of a gated task's two
// writes), each on a run of its own. It reports the process's CPU per step
// (getrusage: the client and, for JetStream, the embedded server it runs
// in, as in serve), the latency of one event's write (registry entry and
// append; for jetstream-raw also the append alone) and of a step's two
// writes.
//
//   - jetstream-raw: bare JetStream calls on serve's embedded server
//     (fsync on every write, the sidecar's least-privilege user): a KV
//     Create in the registry bucket as registry.Open makes it (async
//     persist), a publish of a pre-encoded event with
//     Nats-Expected-Last-Subject-Sequence to the stream natsstore.Open
//     makes. No validation, no encoding, no projection: the component's
//     raw limit.
//   - jetstream-emit: the same through registry.Emitter.EmitIf and
//     natsstore.Store.AppendIf (validation, idempotencyKey check, JSON
//     encoding, persistedAt from the republished headers).
//   - postgres-emit: the same on PostgreSQL (registry.OpenPostgres and
//     pgstore in one database; skipped without SIDECAR_TEST_POSTGRES=1).
//     The server's CPU is in another process: with BENCH_PG_POSTMASTER_PID
//     set to its postmaster's pid, the CPU of the postmaster and its
//     children (the backends, the WAL writer) is added and also reported
//     apart (server-cpu-ms/step).
func BenchmarkStepFloor(b *testing.B) {
	c := context.Background()
	b.Run("jetstream-raw", func(b *testing.B) {
		js := floorServer(b)
		store, err := natsstore.Open(c, js, natsstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = store.Close() })
		open(b, js, registry.Options{Logger: zap.NewNop()})
		kv, err := js.KeyValue(c, registry.DefaultBucket)
		if err != nil {
			b.Fatal(err)
		}
		runFloor(b, func(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (int64, time.Duration, error) {
			key, err := registry.Key(w.RunID, w.IdempotencyKey)
			if err != nil {
				return 0, 0, err
			}
			if _, err := kv.Create(ctx, key, []byte(w.EventID)); err != nil {
				return 0, 0, fmt.Errorf("registry create: %w", err)
			}
			body, err := statestore.EncodeWrite(w)
			if err != nil {
				return 0, 0, err
			}
			began := time.Now()
			ack, err := js.PublishMsg(ctx, &nats.Msg{
				Subject: natsstore.EventSubject(natsstore.DefaultSubjectPrefix, w.RunID, w.IdempotencyKey),
				Data:    body,
				Header: nats.Header{
					jetstream.ExpectedLastSubjSeqHeader:     {fmt.Sprint(lastSeq)},
					jetstream.ExpectedLastSubjSeqSubjHeader: {natsstore.DefaultSubjectPrefix + "." + natsstore.RunToken(w.RunID) + ".>"},
				},
			})
			if err != nil {
				return 0, 0, fmt.Errorf("publish: %w", err)
			}
			return int64(ack.Sequence), time.Since(began), nil
		})
	})
	b.Run("jetstream-emit", func(b *testing.B) {
		js := floorServer(b)
		store, err := natsstore.Open(c, js, natsstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = store.Close() })
		runFloor(b, emitStep(registry.NewEmitter(open(b, js, registry.Options{Logger: zap.NewNop()}), store)))
	})
	b.Run("postgres-emit", func(b *testing.B) {
		store, err := pgstore.Open(c, pgtest.URL(b), pgstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(store.Close)
		r, err := registry.OpenPostgres(c, store.Pool(), registry.PostgresOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if v := os.Getenv("BENCH_PG_POSTMASTER_PID"); v != "" {
			pid, err := strconv.Atoi(v)
			if err != nil {
				b.Fatalf("BENCH_PG_POSTMASTER_PID: %v", err)
			}
			floorServerCPU = func() time.Duration { return treeCPU(b, pid) }
			b.Cleanup(func() { floorServerCPU = nil })
		}
		runFloor(b, emitStep(registry.NewEmitter(r, store)))
	})
}

// floorServer starts the embedded server as serve does (natsstore's
// defaults: fsync on every write, the sidecar's user) and connects to it.
func floorServer(b *testing.B) jetstream.JetStream {
	b.Helper()
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: b.TempDir(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	return natstest.Connect(b, srv)
}

// floorWrite registers w's eventId and appends w on lastSeq; it returns
// the runSeq and the latency of the append alone (0: not measured apart).
type floorWrite func(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (int64, time.Duration, error)

func emitStep(e *registry.Emitter) floorWrite {
	return func(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (int64, time.Duration, error) {
		w.EventID = ""
		res, err := e.EmitIf(ctx, w, lastSeq)
		if err == nil && !res.Persisted {
			err = fmt.Errorf("not persisted: %+v", res)
		}
		return res.RunSeq, 0, err
	}
}

// runFloor runs write's steps at each of floorConcurrency.
func runFloor(b *testing.B, write floorWrite) {
	for _, conc := range floorConcurrency {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) { runFloorAt(b, conc, write) })
	}
}

// runFloorAt runs b.N steps, conc at once, each worker on runs of its own
// of floorChain steps.
func runFloorAt(b *testing.B, conc int, write floorWrite) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tag := time.Now().UnixNano()
	var (
		next                   atomic.Int64
		wg                     sync.WaitGroup
		firstErr               atomic.Value
		mu                     sync.Mutex
		events, appends, steps []time.Duration
	)
	cpu0 := processCPU(b)
	var server0 time.Duration
	if floorServerCPU != nil {
		server0 = floorServerCPU()
	}
	b.ResetTimer()
	for g := range conc {
		wg.Go(func() {
			var ev, ap, st []time.Duration
			defer func() {
				mu.Lock()
				events, appends, steps = append(events, ev...), append(appends, ap...), append(steps, st...)
				mu.Unlock()
			}()
			var runID string
			var lastSeq int64
			for n := 0; ; n++ {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if n%floorChain == 0 {
					runID, lastSeq = fmt.Sprintf("floor-%d-%02d-%07d", tag, g, n/floorChain), 0
				}
				step := fmt.Sprintf("s%02d", n%floorChain)
				stepBegan := time.Now()
				for _, typ := range []string{statestore.StepStarted, statestore.StepCompleted} {
					w := storetest.Event(runID, typ, step)
					w.EventID = uuid.NewString()
					began := time.Now()
					seq, appendTook, err := write(ctx, w, lastSeq)
					if err != nil {
						firstErr.CompareAndSwap(nil, fmt.Errorf("step %d %s: %w", i, typ, err))
						return
					}
					ev = append(ev, time.Since(began))
					if appendTook > 0 {
						ap = append(ap, appendTook)
					}
					lastSeq = seq
				}
				st = append(st, time.Since(stepBegan))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	cpu := processCPU(b) - cpu0
	if floorServerCPU != nil {
		server := floorServerCPU() - server0
		cpu += server
		b.ReportMetric(float64(server.Microseconds())/1000/float64(b.N), "server-cpu-ms/step")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/step")
	reportP50(b, events, "event-p50-ms")
	reportP50(b, appends, "append-p50-ms")
	reportP50(b, steps, "step-p50-ms")
}

// reportP50 reports the median of ds in milliseconds as unit (nothing
// for no samples).
func reportP50(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, unit)
}

// floorServerCPU, when set, reads the CPU time of the store's server
// process so far (PostgreSQL's processes).
var floorServerCPU func() time.Duration

// treeCPU is the CPU time (user and system) of process pid and its
// children, from /proc (clock ticks of 10 ms).
func treeCPU(b *testing.B, pid int) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var ticks int64
	for _, e := range entries {
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // not a process, or gone
		}
		// Fields after the command's closing parenthesis: state, ppid, ...;
		// utime and stime are the 14th and 15th fields of the line.
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		self, _ := strconv.Atoi(e.Name())
		ppid, _ := strconv.Atoi(f[1])
		if self != pid && ppid != pid {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// processCPU is the CPU time (user and system) the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
