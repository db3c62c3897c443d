package archive_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
)

// counting is a Destination that counts the objects read and the
// listings made of the Destination it wraps.
type counting struct {
	archive.Destination
	mu          sync.Mutex
	gets, lists int
	manifests   int // manifests read (that exist)
}

func (c *counting) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	b, err := c.Destination.Get(ctx, name, limit)
	c.mu.Lock()
	c.gets++
	if err == nil && strings.HasPrefix(name, "manifests/") {
		c.manifests++
	}
	c.mu.Unlock()
	return b, err
}

func (c *counting) List(ctx context.Context, prefix string) ([]string, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.Destination.List(ctx, prefix)
}

// reset returns the reads and listings counted since the last reset.
func (c *counting) reset() (gets, lists int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gets, lists = c.gets, c.lists
	c.gets, c.lists, c.manifests = 0, 0, 0
	return gets, lists
}

// writeSegments archives n segments of run i each, with a second copy
// of run 1 (one record shorter) in segment n/2+1, and then the first run
// again (a second copy, one record shorter) in segment n+1.
func writeSegments(t testing.TB, d archive.Destination, n int) []archive.Run {
	t.Helper()
	ctx := context.Background()
	a := mustOpen(t, d)
	runs := finishedRuns(t, "seg", n)
	shorter := func(r archive.Run) archive.Run {
		r.Records = r.Records[:len(r.Records)-1]
		return r
	}
	for i := range n {
		seg := runs[i : i+1]
		if i == n/2 {
			seg = []archive.Run{runs[i], shorter(runs[1])}
		}
		if _, err := a.Write(ctx, seg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Write(ctx, []archive.Run{shorter(runs[0])}); err != nil {
		t.Fatal(err)
	}
	return runs
}

// lookupReadBound is what one lookup after a restart may read, whatever
// the archive holds (up to 2^21 manifests): the catalog's shard of the
// run in at most 3 ranges of each of its 8 levels, the manifests after
// the last full range (at most 31), the probe for a manifest newer than
// the head, and the manifest the catalog names.
const lookupReadBound = lookupShardBound + 31 + 2

// lookupShardBound is the catalog's part of it: a shard of at most 3
// ranges of each of its 8 levels.
const lookupShardBound = 3 * 8

// TestArchive_LookupAfterRestart: a new Archive (a process after a
// restart) finds a run reading a bounded number of objects and listing
// nothing, however many segments the archive holds, and finds its newest
// copy; a run never archived is not found at the same cost. On every
// destination (S3 with SIDECAR_TEST_S3SERVER).
func TestArchive_LookupAfterRestart(t *testing.T) {
	sizes := map[string]int{"Dir": 680, "S3": 170}
	for name, newDest := range destinations(t) {
		t.Run(name, func(t *testing.T) { testLookupAfterRestart(t, newDest(t), sizes[name]) })
	}
}

func testLookupAfterRestart(t *testing.T, dest archive.Destination, n int) {
	ctx := context.Background()
	runs := writeSegments(t, dest, n)
	for _, i := range []int{0, 1, n / 2, n - 1} {
		c := &counting{Destination: dest}
		a := mustOpen(t, c)
		c.reset()
		e, err := a.Lookup(ctx, runs[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		gets, lists := c.reset()
		t.Logf("lookup of run %d of %d segments after a restart: %d objects read, %d listings", i, n, gets, lists)
		want := int64(len(runs[i].Records))
		if i <= 1 {
			want-- // its newest copy
		}
		if e.RunID != runs[i].ID || e.Records != want {
			t.Fatalf("run %d: entry %+v, want %d records", i, e, want)
		}
		if gets > lookupReadBound || lists > 0 {
			t.Fatalf("lookup of run %d of %d segments after a restart: %d objects read, %d listings (want at most %d and 0)", i, n, gets, lists, lookupReadBound)
		}
		recs, err := a.Records(ctx, runs[i].ID)
		if err != nil || int64(len(recs)) != want {
			t.Fatalf("records of run %d: %d, %v", i, len(recs), err)
		}
	}
	c := &counting{Destination: dest}
	a := mustOpen(t, c)
	c.reset()
	if _, err := a.Lookup(ctx, "never archived"); !errors.Is(err, archive.ErrRunNotFound) {
		t.Fatalf("lookup of a run never archived: %v", err)
	}
	if gets, lists := c.reset(); gets > lookupReadBound || lists > 0 {
		t.Fatalf("lookup of a run never archived, %d segments: %d objects read, %d listings", n, gets, lists)
	}
	// The manifests after the last full range were read once: the next
	// lookup of an unknown id (a status of a run that never was) reads
	// only the catalog's shards and the probe, no manifest.
	for i := range 3 {
		if _, err := a.Lookup(ctx, fmt.Sprintf("never archived %d", i)); !errors.Is(err, archive.ErrRunNotFound) {
			t.Fatalf("lookup of a run never archived: %v", err)
		}
		c.mu.Lock()
		manifests := c.manifests
		c.mu.Unlock()
		if gets, lists := c.reset(); manifests > 0 || gets > lookupShardBound+1 || lists > 0 {
			t.Fatalf("lookup %d of a run never archived by the same Archive, %d segments: %d manifests and %d objects in all read, %d listings (want none, at most %d, none)", i+2, n, manifests, gets, lists, lookupShardBound+1)
		}
	}
	if rep := mustVerify(t, dest, archive.VerifyOptions{}); len(rep.Problems) != 0 {
		t.Fatalf("verify: %+v", rep.Problems)
	}
}

// shardOfRun is the name of the catalog shard of level 1 (16 shards)
// covering manifests 1 to 128 that lists runID, and the run's key as the
// shard writes it.
func shardOfRun(runID string) (name, key string) {
	key = sha256Hex([]byte(runID))[:16]
	var shard int
	fmt.Sscanf(key[:1], "%x", &shard)
	return fmt.Sprintf("catalog/1/000000000001-000000000128/016-%03d", shard), key
}

// TestArchive_CatalogIsAHint: what the catalog says is checked against the
// manifests. A shard that is absent or does not parse is read from the
// ranges below it (or the manifests); an entry naming a manifest that does
// not list the run is skipped, so the catalog never makes a lookup return
// another run's records; verify reports every shard that differs from what
// its manifests give and counts the absent ones.
func TestArchive_CatalogIsAHint(t *testing.T) {
	ctx := context.Background()
	const n = 140 // levels 1 (1..128) and 0 (1..128 in 4), then 13 manifests
	setup := func(t *testing.T) (archive.Destination, string, []archive.Run) {
		dest, root := openDir(t)
		runs := writeSegments(t, dest, n)
		rep := mustVerify(t, dest, archive.VerifyOptions{})
		if len(rep.Problems) != 0 || rep.CatalogShards != 4*4+16 || rep.CatalogMissing != 0 {
			t.Fatalf("verify of a whole catalog: problems %+v, %d shards, %d missing", rep.Problems, rep.CatalogShards, rep.CatalogMissing)
		}
		return dest, root, runs
	}
	lookupAll := func(t *testing.T, dest archive.Destination, runs []archive.Run) {
		t.Helper()
		for i, r := range runs {
			e, err := mustOpen(t, dest).Lookup(ctx, r.ID)
			if err != nil || e.RunID != r.ID {
				t.Fatalf("lookup of run %d: %+v, %v", i, e, err)
			}
		}
	}
	t.Run("LevelAbsent", func(t *testing.T) {
		dest, root, runs := setup(t)
		if err := os.RemoveAll(filepath.Join(root, "catalog", "1")); err != nil {
			t.Fatal(err)
		}
		lookupAll(t, dest, runs)
		rep := mustVerify(t, dest, archive.VerifyOptions{})
		if len(rep.Problems) != 0 || rep.CatalogShards != 16 || rep.CatalogMissing != 16 {
			t.Fatalf("verify: problems %+v, %d shards, %d missing", rep.Problems, rep.CatalogShards, rep.CatalogMissing)
		}
	})
	t.Run("CatalogAbsent", func(t *testing.T) {
		dest, root, runs := setup(t)
		if err := os.RemoveAll(filepath.Join(root, "catalog")); err != nil {
			t.Fatal(err)
		}
		lookupAll(t, dest, runs)
		if rep := mustVerify(t, dest, archive.VerifyOptions{}); len(rep.Problems) != 0 || rep.CatalogMissing != 32 {
			t.Fatalf("verify: problems %+v, %d missing", rep.Problems, rep.CatalogMissing)
		}
	})
	t.Run("ShardGarbage", func(t *testing.T) {
		dest, root, runs := setup(t)
		name, _ := shardOfRun(runs[10].ID)
		if err := os.WriteFile(filepath.Join(root, name), []byte("not a shard\n"), 0o640); err != nil {
			t.Fatal(err)
		}
		lookupAll(t, dest, runs)
		rep := mustVerify(t, dest, archive.VerifyOptions{})
		if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemCatalogInvalid || rep.Problems[0].Object != name {
			t.Fatalf("verify: problems %+v", rep.Problems)
		}
	})
	t.Run("WrongEntry", func(t *testing.T) {
		dest, root, runs := setup(t)
		// runs[10] is in manifest 11; an entry naming manifest 100 (which
		// lists runs[99]) after it is checked and skipped.
		name, key := shardOfRun(runs[10].ID)
		path := filepath.Join(root, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		right := key + " 11\n"
		if !strings.Contains(string(b), right) {
			t.Fatalf("shard %s has no line %q:\n%s", name, right, b)
		}
		if err := os.WriteFile(path, []byte(strings.Replace(string(b), right, right+key+" 100\n", 1)), 0o640); err != nil {
			t.Fatal(err)
		}
		recs, err := mustOpen(t, dest).Records(ctx, runs[10].ID)
		if err != nil || len(recs) != len(runs[10].Records) || recs[0].RunID != runs[10].ID {
			t.Fatalf("records past a wrong entry: %d, %v", len(recs), err)
		}
		rep := mustVerify(t, dest, archive.VerifyOptions{})
		if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemCatalogInvalid || rep.Problems[0].Object != name {
			t.Fatalf("verify: problems %+v", rep.Problems)
		}
		// Only the wrong entry: the run is not found (the catalog is
		// trusted for absence, so a lookup of an unknown run stays
		// bounded), never found as another run; verify names the shard.
		if err := os.WriteFile(path, []byte(strings.Replace(string(b), right, key+" 100\n", 1)), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := mustOpen(t, dest).Records(ctx, runs[10].ID); !errors.Is(err, archive.ErrRunNotFound) {
			t.Fatalf("records with only a wrong entry: %v, want ErrRunNotFound", err)
		}
		if rep := mustVerify(t, dest, archive.VerifyOptions{}); len(rep.Problems) != 1 || rep.Problems[0].Object != name {
			t.Fatalf("verify: problems %+v", rep.Problems)
		}
	})
	t.Run("ForeignObject", func(t *testing.T) {
		dest, root, _ := setup(t)
		if err := os.WriteFile(filepath.Join(root, "catalog", "notes.txt"), []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
		rep := mustVerify(t, dest, archive.VerifyOptions{})
		if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemCatalogInvalid {
			t.Fatalf("verify: problems %+v", rep.Problems)
		}
	})
}

// TestArchive_CatalogTwoWriters: two writers taking turns on one archive
// build the catalog's ranges each where its write completes one; the
// shards match the manifests and a third process finds every run.
func TestArchive_CatalogTwoWriters(t *testing.T) {
	ctx := context.Background()
	dest, _ := openDir(t)
	a, b := mustOpen(t, dest), mustOpen(t, dest)
	runs := finishedRuns(t, "two", 70)
	for i := range runs {
		w := a
		if i%3 == 0 {
			w = b
		}
		if _, err := w.Write(ctx, runs[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	rep := mustVerify(t, dest, archive.VerifyOptions{})
	if len(rep.Problems) != 0 || rep.CatalogShards != 2*4 || rep.CatalogMissing != 0 {
		t.Fatalf("verify: problems %+v, %d shards, %d missing", rep.Problems, rep.CatalogShards, rep.CatalogMissing)
	}
	// a opened before b wrote its last segments: it learns the new head.
	for _, r := range runs {
		if e, err := a.Lookup(ctx, r.ID); err != nil || e.RunID != r.ID {
			t.Fatalf("lookup of %q by a writer: %+v, %v", r.ID, e, err)
		}
	}
	last := finishedRuns(t, "later", 1)
	if _, err := b.Write(ctx, last); err != nil {
		t.Fatal(err)
	}
	if e, err := a.Lookup(ctx, last[0].ID); err != nil || e.RunID != last[0].ID {
		t.Fatalf("lookup of a run the other writer archived since: %+v, %v", e, err)
	}
}

// TestArchive_CatalogWriteFails: a catalog shard that cannot be written
// does not fail the Write that completed its range (the runs are archived;
// the catalog is a hint): lookups read the manifests instead, and verify
// counts the shards missing.
func TestArchive_CatalogWriteFails(t *testing.T) {
	ctx := context.Background()
	dir, _ := openDir(t)
	down := &archive.Error{Code: archive.CodeUnavailable, Message: "connection refused"}
	f := &failing{Dir: dir, putNew: func(name string) error {
		if strings.HasPrefix(name, "catalog/") {
			return down
		}
		return nil
	}}
	a := mustOpen(t, f)
	runs := finishedRuns(t, "cf", 33)
	for i := range runs {
		if _, err := a.Write(ctx, runs[i:i+1]); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for _, r := range runs {
		if e, err := mustOpen(t, dir).Lookup(ctx, r.ID); err != nil || e.RunID != r.ID {
			t.Fatalf("lookup without a catalog: %+v, %v", e, err)
		}
	}
	if rep := mustVerify(t, dir, archive.VerifyOptions{}); len(rep.Problems) != 0 || rep.CatalogMissing != 4 {
		t.Fatalf("verify: problems %+v, %d missing", rep.Problems, rep.CatalogMissing)
	}
}

// gated is a Destination whose reads of one object wait until released.
type gated struct {
	archive.Destination
	name    string
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *gated) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	if name == g.name {
		g.once.Do(func() { close(g.reached) })
		<-g.release
	}
	return g.Destination.Get(ctx, name, limit)
}

// TestArchive_LookupWhileRefreshing: a lookup (status of an archived run)
// does not wait for a Refresh (retention's read of every manifest after a
// restart) that is still reading.
func TestArchive_LookupWhileRefreshing(t *testing.T) {
	ctx := context.Background()
	dir, _ := openDir(t)
	runs := writeSegments(t, dir, 40)
	g := &gated{Destination: dir, name: "manifests/000000000002.json", reached: make(chan struct{}), release: make(chan struct{})}
	a := mustOpen(t, g)
	refreshed := make(chan error, 1)
	go func() { refreshed <- a.Refresh(ctx) }()
	<-g.reached
	looked := make(chan error, 1)
	go func() {
		_, err := a.Lookup(ctx, runs[35].ID)
		looked <- err
	}()
	select {
	case err := <-looked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("lookup still waiting for a Refresh that is reading manifests after 2 minutes")
	}
	close(g.release)
	if err := <-refreshed; err != nil {
		t.Fatal(err)
	}
	if e, err := a.LookupRead(ctx, runs[1].ID); err != nil || e.RunID != runs[1].ID {
		t.Fatalf("LookupRead after Refresh: %+v, %v", e, err)
	}
}
