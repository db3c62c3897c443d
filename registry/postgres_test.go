package registry_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openPG returns the log and a Registry on one fresh database.
func openPG(t *testing.T, url string) (*pgstore.Store, *registry.Registry) {
	t.Helper()
	store, err := pgstore.Open(ctx(t), url, pgstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	r, err := registry.OpenPostgres(ctx(t), store.Pool(), registry.PostgresOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return store, r
}

func TestPostgres_EventID(t *testing.T) {
	url := pgtest.URL(t)
	_, r := openPG(t, url)

	t.Run("CreatedThenFound", func(t *testing.T) {
		id, created, err := r.EventID(ctx(t), "run.1", idemKey(1))
		if err != nil || !created || !isUUIDv4(id) {
			t.Fatalf("first: %q %v %v", id, created, err)
		}
		again, created, err := r.EventID(ctx(t), "run.1", idemKey(1))
		if err != nil || created || again != id {
			t.Fatalf("second: %q %v %v, want %q found", again, created, err, id)
		}
		if got, err := r.Lookup(ctx(t), "run.1", idemKey(1)); err != nil || got != id {
			t.Fatalf("lookup: %q %v", got, err)
		}
	})
	t.Run("DistinctKeys", func(t *testing.T) {
		a, _, _ := r.EventID(ctx(t), "run.2", idemKey(1))
		b, _, _ := r.EventID(ctx(t), "run.2", idemKey(2))
		c, _, _ := r.EventID(ctx(t), "run.3", idemKey(1))
		if a == b || a == c || b == c {
			t.Fatalf("keys share an eventId: %s %s %s", a, b, c)
		}
	})
	t.Run("ErrInvalidInput", func(t *testing.T) {
		conn := rawConn(t, url)
		before := rows(t, conn)
		for _, tc := range []struct{ run, key string }{
			{"", idemKey(1)}, {"run\x00", idemKey(1)}, {strings.Repeat("r", 300), idemKey(1)},
			{"run", "short"}, {"run", strings.ToUpper(idemKey(1))},
		} {
			if _, _, err := r.EventID(ctx(t), tc.run, tc.key); !errors.Is(err, registry.ErrInvalidInput) {
				t.Errorf("EventID(%q, %q): %v, want ErrInvalidInput", tc.run, tc.key, err)
			}
		}
		if err := r.Adopt(ctx(t), "run", idemKey(1), "not-a-uuid"); !errors.Is(err, registry.ErrInvalidInput) {
			t.Errorf("Adopt of a bad eventId: %v", err)
		}
		if after := rows(t, conn); after != before {
			t.Fatalf("invalid input wrote %d rows", after-before)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		if _, err := r.Lookup(ctx(t), "run.none", idemKey(1)); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("lookup of a missing key: %v", err)
		}
	})
	t.Run("ErrUnavailable", func(t *testing.T) {
		store, down := openPG(t, pgtest.URL(t))
		store.Close()
		if _, _, err := down.EventID(ctx(t), "run.1", idemKey(1)); !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("closed pool: %v", err)
		}
	})
}

func TestPostgres_Adopt(t *testing.T) {
	_, r := openPG(t, pgtest.URL(t))
	id, _, _ := r.EventID(ctx(t), "run.a", idemKey(1))
	other := "0f0c6a4e-4b7d-4f5e-9c1a-2b3c4d5e6f70"
	if err := r.Adopt(ctx(t), "run.a", idemKey(1), other); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Lookup(ctx(t), "run.a", idemKey(1)); got != other {
		t.Fatalf("after adopt: %q, want %q (was %q)", got, other, id)
	}
	if again, created, _ := r.EventID(ctx(t), "run.a", idemKey(1)); created || again != other {
		t.Fatalf("EventID after adopt: %q created %v", again, created)
	}
	// Idempotent, and a missing entry is created.
	if err := r.Adopt(ctx(t), "run.a", idemKey(1), other); err != nil {
		t.Fatal(err)
	}
	if err := r.Adopt(ctx(t), "run.missing", idemKey(1), other); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Lookup(ctx(t), "run.missing", idemKey(1)); got != other {
		t.Fatalf("adopt of a missing entry: %q", got)
	}
}

// registryProcEnv makes the test binary a producer process (see
// TestPostgres_RaceAcrossProcesses).
const registryProcEnv = "REGISTRY_TEST_PG_PRODUCER"

// TestPostgres_RaceAcrossProcesses: four OS processes with eight
// goroutines each request eventIds for the same 30 keys at once. Every key
// ends with one eventId, the one every producer returned, created by
// exactly one of them.
func TestPostgres_RaceAcrossProcesses(t *testing.T) {
	url := pgtest.URL(t)
	openPG(t, url) // migrated
	const procs = 4
	outs := make([]string, procs)
	var wg sync.WaitGroup
	for p := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestPostgres_ProducerProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), registryProcEnv+"="+url)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("producer %d: %v\n%s", p, err, out)
			}
			outs[p] = string(out)
		})
	}
	wg.Wait()
	ids := map[int]string{}
	created := map[int]int{}
	for p, out := range outs {
		for _, line := range strings.Split(out, "\n") {
			var k int
			var id, how string
			if n, _ := fmt.Sscanf(line, "key %d %s %s", &k, &id, &how); n != 3 {
				continue
			}
			if ids[k] == "" {
				ids[k] = id
			}
			if ids[k] != id {
				t.Fatalf("key %d: process %d got %s, another %s", k, p, id, ids[k])
			}
			if how == "created" {
				created[k]++
			}
		}
	}
	if len(ids) != 30 {
		t.Fatalf("%d keys answered, want 30", len(ids))
	}
	for k := range 30 {
		if created[k] != 1 {
			t.Fatalf("key %d created %d times, want once", k, created[k])
		}
	}
}

// TestPostgres_ProducerProcess is one producer of
// TestPostgres_RaceAcrossProcesses; it does nothing on its own.
func TestPostgres_ProducerProcess(t *testing.T) {
	url := os.Getenv(registryProcEnv)
	if url == "" {
		t.Skip("a producer process of TestPostgres_RaceAcrossProcesses")
	}
	_, r := openPG(t, url)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range 30 {
				id, created, err := r.EventID(ctx(t), "race.run", idemKey(k))
				if err != nil {
					t.Error(err)
					return
				}
				how := "found"
				if created {
					how = "created"
				}
				mu.Lock()
				fmt.Printf("key %d %s %s\n", k, id, how)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestPostgres_Emitter: racing producers and a lost registry entry, the
// protocol of §2.5.1 with both the registry and the log on PostgreSQL
// (each producer a Registry of its own on the store's pool).
func TestPostgres_Emitter(t *testing.T) {
	store, _ := openPG(t, pgtest.URL(t))
	emitterProtocol(t, store, func(t *testing.T) *registry.Registry {
		r, err := registry.OpenPostgres(ctx(t), store.Pool(), registry.PostgresOptions{Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
	t.Run("EmitBatch", func(t *testing.T) {
		store, r := openPG(t, pgtest.URL(t))
		emitBatchProtocol(t, store, r)
	})
}

func rawConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func rows(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx(t), "SELECT count(*) FROM event_ids").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
