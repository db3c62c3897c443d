package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// writeArchive archives one finished run in a new directory and returns
// the archive's URL, its directory, the run and its manifest.
func writeArchive(t *testing.T) (string, string, archive.Run, *archive.Manifest) {
	t.Helper()
	ctx := context.Background()
	s := memstore.New(statestore.ProjectorOptions{})
	id := "run-archived-1"
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event(id, statestore.RunStarted, ""),
		storetest.Event(id, statestore.StepStarted, "s1"),
		storetest.Event(id, statestore.StepCompleted, "s1"),
		storetest.Event(id, statestore.RunCompleted, ""),
	} {
		if _, err := s.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.Fetch(ctx, id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "archive")
	if err := archive.NewDir(dir).CheckWritable(); err != nil { // serve makes it at start
		t.Fatal(err)
	}
	a, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	run := archive.Run{ID: id, Records: recs}
	m, err := a.Write(ctx, []archive.Run{run})
	if err != nil {
		t.Fatal(err)
	}
	return "file://" + dir, dir, run, m
}

func TestArchiveCommand_Verify(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		url, _, _, m := writeArchive(t)
		code, out, errOut := run(t, "archive", "verify", "--archive", url, "--expect-head", m.Chain)
		if code != exitOK || !strings.Contains(out, "1 run, 4 records: 0 problems") || !strings.Contains(out, "head "+m.Chain) {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("Corrupt", func(t *testing.T) {
		url, dir, _, m := writeArchive(t)
		p := filepath.Join(dir, m.Segment)
		b, _ := os.ReadFile(p)
		b[len(b)/2] ^= 1
		os.WriteFile(p, b, 0o600)
		code, out, errOut := run(t, "archive", "verify", "-o", "json", "--archive", url)
		var rep archive.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if code != exitError || len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemSegmentCorrupt || !strings.Contains(errOut, "1 problems") {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("Catalog", func(t *testing.T) {
		ctx := context.Background()
		url, dir, r, _ := writeArchive(t)
		a, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for range 31 { // manifest 32 completes the catalog's first range
			if _, err := a.Write(ctx, []archive.Run{r}); err != nil {
				t.Fatal(err)
			}
		}
		shards, err := filepath.Glob(filepath.Join(dir, "catalog", "0", "*", "*"))
		if err != nil || len(shards) != 4 {
			t.Fatalf("shards of the first range: %v, %v", shards, err)
		}
		os.Remove(shards[0])
		code, out, errOut := run(t, "archive", "verify", "--archive", url)
		if code != exitOK || !strings.Contains(out, "catalog: 3 shards match their manifests, 1 missing") {
			t.Fatalf("a shard missing: exit %d\n%s%s", code, out, errOut)
		}
		os.WriteFile(shards[1], []byte("edited\n"), 0o600)
		code, out, errOut = run(t, "archive", "verify", "--archive", url)
		if code != exitError || !strings.Contains(out, "PROBLEM "+archive.ProblemCatalogInvalid) {
			t.Fatalf("a shard edited: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "archive")
		if err := os.Mkdir(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		url := "file://" + dir
		code, out, errOut := run(t, "archive", "verify", "--archive", url)
		if code != exitError || !strings.Contains(out, "PROBLEM "+archive.ProblemArchiveEmpty) || !strings.Contains(out, url) || !strings.Contains(errOut, "--allow-empty") {
			t.Fatalf("no manifest: exit %d\n%s%s", code, out, errOut)
		}
		code, out, errOut = run(t, "archive", "verify", "--archive", url, "--allow-empty")
		if code != exitOK || !strings.Contains(out, "0 manifests") || !strings.Contains(out, "0 problems") {
			t.Fatalf("no manifest, --allow-empty: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("NoDirectory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "nonexistent")
		code, out, errOut := run(t, "archive", "verify", "--archive", "file://"+dir, "--allow-empty")
		if code != exitArchiveUnreadable || !strings.Contains(errOut, archive.CodeUnavailable) || !strings.Contains(errOut, dir) || !strings.Contains(errOut, "nothing was verified") {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("Unreadable", func(t *testing.T) {
		// A segment the file system cannot read (a directory in its
		// place, whoever runs the test): no problem is proven.
		url, dir, _, m := writeArchive(t)
		p := filepath.Join(dir, m.Segment)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := run(t, "archive", "verify", "--archive", url)
		if code != exitArchiveUnreadable || !strings.Contains(errOut, archive.CodeUnavailable) || strings.Contains(out, "PROBLEM") {
			t.Fatalf("segment unreadable: exit %d, want %d and no problem\n%s%s", code, exitArchiveUnreadable, out, errOut)
		}
		if _, out, _ := run(t, "archive", "verify", "-h"); !strings.Contains(out, "1  it does not") || !strings.Contains(out, "3  the archive could not be read") {
			t.Fatalf("help: no exit status\n%s", out)
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		for _, args := range [][]string{
			{"archive"}, {"archive", "nope"}, {"archive", "verify"},
			{"archive", "verify", "--archive", "s4://x"}, {"archive", "verify", "--archive", "file:///tmp", "extra"},
			{"archive", "events", "--archive", "file:///tmp"}, {"archive", "verify", "--archive", "file:///tmp", "-o", "yaml"},
		} {
			if code, _, errOut := run(t, args...); code != exitUsage {
				t.Errorf("sidecar %s: exit %d, want 2\n%s", strings.Join(args, " "), code, errOut)
			}
		}
	})
}

func TestArchiveCommand_Events(t *testing.T) {
	url, _, r, _ := writeArchive(t)
	code, out, errOut := run(t, "archive", "events", r.ID, "--archive", url, "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var got []statestore.RunEventRecord
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var rec statestore.RunEventRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		got = append(got, rec)
	}
	if !reflect.DeepEqual(got, r.Records) {
		t.Fatalf("got %+v, want %+v", got, r.Records)
	}
	code, out, _ = run(t, "archive", "events", r.ID, "--archive", url, "--vocabulary", "core")
	if code != exitOK || strings.Count(out, "\n") == 0 {
		t.Fatalf("core vocabulary: exit %d\n%s", code, out)
	}
	code, _, errOut = run(t, "archive", "events", "no-such-run", "--archive", url)
	if code != exitError || !strings.Contains(errOut, archive.CodeRunNotFound) {
		t.Fatalf("unknown run: exit %d\n%s", code, errOut)
	}
}

func TestArchiveCommand_VerifyKeys(t *testing.T) {
	ctx := context.Background()
	url, dir, r, _ := writeArchive(t) // manifest 1, written without keys
	keyFile := filepath.Join(t.TempDir(), "archive.keys")
	if err := os.WriteFile(keyFile, []byte("# the signing key\n"+strings.Repeat("k", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := archive.LoadKeys(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// writeOne archives r's records again (a second copy, as the sidecar
	// writes one) through an Archive with keys (nil: none).
	writeOne := func(keys *archive.Keys) {
		t.Helper()
		a, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Write(ctx, []archive.Run{r}); err != nil {
			t.Fatal(err)
		}
	}
	writeOne(keys) // manifest 2, signed

	code, out, errOut := run(t, "archive", "verify", "--archive", url, "--archive-key-file", keyFile)
	if code != exitOK || !strings.Contains(out, "signatures: 1 manifest signed from manifest 2 on (1 to 1 were written before the archive had keys)") {
		t.Fatalf("signed from 2: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := run(t, "archive", "events", "--archive", url, "--archive-key-file", keyFile, "-o", "json", r.ID); code != exitOK || strings.Count(out, `"runSeq"`) != 4 {
		t.Fatalf("events with the key: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := run(t, "archive", "verify", "--archive", url); code != exitOK || !strings.Contains(out, "signatures: not checked (no --archive-key-file)") {
		t.Fatalf("without the key: exit %d\n%s", code, out)
	}

	writeOne(nil) // manifest 3: chained and hashed, but not signed
	code, out, errOut = run(t, "archive", "verify", "--archive", url, "--archive-key-file", keyFile)
	if code != exitError || !strings.Contains(out, "PROBLEM ARCHIVE_MANIFEST_UNSIGNED manifests/000000000003.json") {
		t.Fatalf("an unsigned manifest after a signed one: exit %d\n%s%s", code, out, errOut)
	}

	os.Chmod(keyFile, 0o644)
	if code, _, errOut := run(t, "archive", "verify", "--archive", url, "--archive-key-file", keyFile); code != exitUsage || !strings.Contains(errOut, "chmod 600 "+keyFile) {
		t.Fatalf("a key file others can read: exit %d\n%s", code, errOut)
	}
	short := filepath.Join(t.TempDir(), "short.keys")
	os.WriteFile(short, []byte("short\n"), 0o600)
	if code, _, errOut := run(t, "archive", "verify", "--archive", url, "--archive-key-file", short); code != exitUsage || !strings.Contains(errOut, "at least 32") {
		t.Fatalf("a short key: exit %d\n%s", code, errOut)
	}
}
