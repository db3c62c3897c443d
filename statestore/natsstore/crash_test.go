package natsstore_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// envCrashChild makes the test binary the appending child of
// TestStore_SurvivesSIGKILL, with the data dir as its value.
const envCrashChild = "NATSSTORE_CRASH_CHILD_DIR"

const crashRun = "run-crash"

// TestStore_SurvivesSIGKILL re-executes the test binary as a child that
// runs an embedded server (fsync always) and appends events, printing each
// acknowledged runSeq. The parent kills it with SIGKILL mid-stream, starts a
// server on the same data dir and expects every acknowledged record.
func TestStore_SurvivesSIGKILL(t *testing.T) {
	if dir := os.Getenv(envCrashChild); dir != "" {
		crashChild(dir)
		return
	}
	const killAfter = 300
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStore_SurvivesSIGKILL$")
	cmd.Env = append(os.Environ(), envCrashChild+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[int64]string{} // runSeq -> eventId
	killed := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "ERR" {
			t.Fatalf("child: %s", sc.Text())
		}
		if len(f) != 3 || f[0] != "ACK" {
			continue
		}
		seq, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatalf("child printed %q", sc.Text())
		}
		acked[seq] = f[2]
		if len(acked) == killAfter && !killed {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("child ended after %d acks without being killed: %v\n%s", len(acked), err, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}

	srv := startServer(t, dir)
	js := connect(t, srv)
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := mustFetch(t, s, crashRun)
	stored := make(map[int64]string, len(recs))
	var maxSeq int64
	for _, r := range recs {
		stored[r.RunSeq] = r.EventID
		maxSeq = max(maxSeq, r.RunSeq)
	}
	for seq, id := range acked {
		if stored[seq] != id {
			t.Errorf("acknowledged runSeq %d (%s) is %q after the crash", seq, id, stored[seq])
		}
	}
	t.Logf("%d acknowledged before SIGKILL, %d stored after restart", len(acked), len(recs))
	next := mustAppend(t, s, storetest.Event(crashRun, statestore.RunCompleted, ""))
	if next.RunSeq <= maxSeq {
		t.Fatalf("runSeq after restart %d, not above %d", next.RunSeq, maxSeq)
	}
}

// crashChild appends until it is killed (or for at most 30s), printing
// "ACK <runSeq> <eventId>" after each acknowledged append.
func crashChild(dir string) {
	fail := func(err error) {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: dir, Logger: zap.NewNop()})
	if err != nil {
		fail(err)
	}
	nc, err := srv.Connect()
	if err != nil {
		fail(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	s, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		fail(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		w := storetest.Event(crashRun, statestore.StepStarted, fmt.Sprintf("s%06d", i))
		res, err := s.Append(ctx, w)
		if err != nil {
			fail(err)
		}
		// One write(2) per line, straight to the pipe: no user-space buffer
		// to lose when the process is killed.
		fmt.Fprintf(os.Stdout, "ACK %d %s\n", res.RunSeq, res.EventID)
	}
	os.Exit(2)
}
