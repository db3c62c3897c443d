package exec_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

func BenchmarkNoop_Execute(b *testing.B) {
	reg := exec.New(exec.Options{Logger: zap.NewNop()})
	e, _ := reg.For(plan.ExecutorNoop)
	x := execution(b, plan.ExecutorSpec{Type: plan.ExecutorNoop})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if res, err := e.Execute(ctx, x); err != nil || res.Err != nil {
			b.Fatal(err, res.Err)
		}
	}
}

// BenchmarkCommand_Execute runs `true`: spawn, wait, and (WithStore) two
// artifact puts on an embedded JetStream that fsyncs every write;
// Recorded adds the command's record in a CommandDir.
func BenchmarkCommand_Execute(b *testing.B) {
	for _, name := range []string{"NoStore", "Recorded", "WithStore"} {
		opts := exec.Options{Logger: zap.NewNop()}
		switch name {
		case "Recorded":
			opts.CommandDir = b.TempDir()
		case "WithStore":
			opts.Artifacts = startStore(b).store
		}
		b.Run(name, func(b *testing.B) {
			reg := exec.New(opts)
			if err := reg.Open(context.Background()); err != nil {
				b.Fatal(err)
			}
			defer reg.Close(context.Background())
			x := execution(b, cmd("true"))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				x.EngineAttemptID++
				if res, err := reg.Execute(ctx, x); err != nil || res.Err != nil {
					b.Fatal(err, res.Err)
				}
			}
		})
	}
}

// BenchmarkHTTP_Execute sends one GET to a local server and stores the body.
func BenchmarkHTTP_Execute(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer srv.Close()
	reg := exec.New(exec.Options{Logger: zap.NewNop(), Artifacts: startStore(b).store, HTTPAllow: allowLoopback})
	x := execution(b, plan.ExecutorSpec{Type: plan.ExecutorHTTP, URL: srv.URL})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		x.EngineAttemptID++
		if res, err := reg.Execute(ctx, x); err != nil || res.Err != nil {
			b.Fatal(err, res.Err)
		}
	}
}
