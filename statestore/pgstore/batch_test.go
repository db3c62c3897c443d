package pgstore_test

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

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// batchChildEnv makes the test binary the appending child of
// TestAppendBatch_SIGKILLLeavesRunsWholeOrEmpty, with the URL as its value.
const batchChildEnv = "PGSTORE_TEST_BATCH_CHILD"

const (
	crashBatches = 40  // batches the child appends unless killed
	crashRuns    = 300 // runs per batch, three events each
)

// TestAppendBatch_SIGKILLLeavesRunsWholeOrEmpty re-executes the test
// binary as a child that appends batches of crashRuns runs, three events
// each, printing SENT before a batch and DONE after it, and kills it with
// SIGKILL while batch 3 is in flight: once when the child's connection
// holds a transaction id (the batch has written, uncommitted), once as
// soon as any event of batch 3 is visible to another connection. Every
// run must then have all three events or none.
func TestAppendBatch_SIGKILLLeavesRunsWholeOrEmpty(t *testing.T) {
	if url := os.Getenv(batchChildEnv); url != "" {
		batchChild(t, url)
		return
	}
	url := pgtest.URL(t)
	s := open(t, url)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	var round int
	for _, tc := range []struct {
		name string
		due  func(batch int) bool
	}{
		{"MidTransaction", func(int) bool {
			var n int
			err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'batchcrash' AND backend_xid IS NOT NULL").Scan(&n)
			return err == nil && n > 0
		}},
		{"AsEventsAppear", func(batch int) bool {
			var n int
			err := conn.QueryRow(ctx, "SELECT count(*) FROM run_events WHERE run_id LIKE $1", fmt.Sprintf("crash-r%d-b%d-%%", round, batch)).Scan(&n)
			return err == nil && n > 0
		}},
	} {
		round++
		t.Run(tc.name, func(t *testing.T) { killMidBatch(t, s, url, round, tc.due) })
	}
}

// killMidBatch runs the child of round and kills it once batch 3 is sent
// and due says so; then it checks every run of the batches sent.
func killMidBatch(t *testing.T, s *pgstore.Store, url string, round int, due func(batch int) bool) {
	const victim = 3
	cmd := exec.Command(os.Args[0], "-test.run=^TestAppendBatch_SIGKILLLeavesRunsWholeOrEmpty$", "-test.count=1")
	cmd.Env = append(os.Environ(), batchChildEnv+"="+url+"&application_name=batchcrash", "PGSTORE_TEST_BATCH_ROUND="+strconv.Itoa(round))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	done, sent := -1, -1
	killed := false
	for line := range lines {
		if strings.HasPrefix(line, "ERR ") {
			t.Fatalf("child: %s", line)
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "DONE":
			done = n
		case "SENT":
			sent = n
		}
		if sent == victim && done < victim && !killed {
			for !due(victim) {
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("child ended without being killed: %v\n%s", err, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}
	ctx := context.Background()
	whole := map[int]int{} // batch -> runs with all three events
	for b := 0; b <= sent; b++ {
		for i := range crashRuns {
			recs, err := s.Fetch(ctx, crashRunID(round, b, i), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			switch len(recs) {
			case 0:
			case 3:
				whole[b]++
			default:
				t.Fatalf("run %s has %d of its 3 events after the kill: half a run", crashRunID(round, b, i), len(recs))
			}
		}
		if b <= done && whole[b] != crashRuns {
			t.Fatalf("batch %d was acknowledged but %d of its %d runs are stored", b, whole[b], crashRuns)
		}
	}
	t.Logf("killed while batch %d was in flight (%d acknowledged); its runs stored whole: %d of %d", sent, done+1, whole[sent], crashRuns)
}

func crashRunID(round, batch, i int) string { return fmt.Sprintf("crash-r%d-b%d-%d", round, batch, i) }

func batchChild(t *testing.T, url string) {
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		fmt.Println("ERR", strconv.Quote(err.Error()))
		return
	}
	defer s.Close()
	round, _ := strconv.Atoi(os.Getenv("PGSTORE_TEST_BATCH_ROUND"))
	for b := range crashBatches {
		runs := make([]statestore.RunBatch, crashRuns)
		for i := range runs {
			id := crashRunID(round, b, i)
			runs[i] = statestore.RunBatch{Events: []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""),
				storetest.Event(id, statestore.RunPaused, ""), storetest.Event(id, statestore.RunDrainCompleted, "")}}
		}
		fmt.Println("SENT", b)
		for i, r := range s.AppendBatch(context.Background(), runs) {
			if r.Err != nil {
				fmt.Println("ERR", strconv.Quote(fmt.Sprintf("run %d: %v", i, r.Err)))
				return
			}
		}
		fmt.Println("DONE", b)
	}
	t.Log("all batches appended")
}
