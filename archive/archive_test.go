package archive_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// finishedRuns appends n finished runs (RunStarted, a step, RunCompleted;
// a payload with characters JSON could escape) to a memstore and returns
// them as Write takes them.
func finishedRuns(t testing.TB, prefix string, n int) []archive.Run {
	t.Helper()
	ctx := context.Background()
	s := memstore.New(statestore.ProjectorOptions{})
	runs := make([]archive.Run, 0, n)
	for i := range n {
		id := fmt.Sprintf("%s-%d <&>", prefix, i)
		events := []*statestore.RunEventWrite{
			storetest.Event(id, statestore.RunStarted, ""),
			storetest.Event(id, statestore.StepStarted, "s1"),
			withRawPayload(storetest.Event(id, statestore.StepCompleted, "s1"), `{"outputs":{"note":"a<b & c>d \u2028 é"}}`),
			storetest.Event(id, statestore.RunCompleted, ""),
		}
		for _, w := range events {
			if _, err := s.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		recs, err := s.Fetch(ctx, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, archive.Run{ID: id, Records: recs})
	}
	return runs
}

func openDir(t testing.TB) (*archive.Dir, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "archive")
	d := archive.NewDir(root)
	if err := d.CheckWritable(); err != nil { // what serve does at start
		t.Fatal(err)
	}
	return d, root
}

func mustOpen(t testing.TB, d archive.Destination) *archive.Archive {
	t.Helper()
	a, err := archive.Open(context.Background(), d, archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustVerify(t testing.TB, d archive.Destination, opts archive.VerifyOptions) *archive.Report {
	t.Helper()
	rep, err := archive.Verify(context.Background(), d, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestArchive_Write(t *testing.T) {
	ctx := context.Background()
	t.Run("OK", func(t *testing.T) {
		d, _ := openDir(t)
		a := mustOpen(t, d)
		runs := finishedRuns(t, "r", 5)
		m1, err := a.Write(ctx, runs[:3])
		if err != nil {
			t.Fatal(err)
		}
		m2, err := a.Write(ctx, runs[3:])
		if err != nil {
			t.Fatal(err)
		}
		if m1.Seq != 1 || m1.Prev != archive.Genesis || m2.Seq != 2 || m2.Prev != m1.Chain {
			t.Fatalf("got seq %d prev %s, seq %d prev %s; want 1 genesis, 2 chaining to %s", m1.Seq, m1.Prev, m2.Seq, m2.Prev, m1.Chain)
		}
		if m1.Records != 12 || len(m1.Runs) != 3 || m1.Runs[0].LastEventType != statestore.RunCompleted || m1.Runs[2].TenantID != "tenant_acme" {
			t.Fatalf("got manifest %+v", m1)
		}
		// Every run reads back exactly as the store returned it, from this
		// Archive and from a fresh one.
		for _, reader := range []*archive.Archive{a, mustOpen(t, d)} {
			for _, r := range runs {
				got, err := reader.Records(ctx, r.ID)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, r.Records) {
					t.Fatalf("run %s: got %+v, want %+v", r.ID, got, r.Records)
				}
			}
		}
		rep := mustVerify(t, d, archive.VerifyOptions{ExpectHead: m1.Chain})
		if len(rep.Problems) != 0 || rep.Manifests != 2 || rep.Runs != 5 || rep.Records != 20 || rep.Head != m2.Chain {
			t.Fatalf("got report %+v", rep)
		}
	})
	t.Run("LinesAreTheStoredRecords", func(t *testing.T) {
		d, root := openDir(t)
		runs := finishedRuns(t, "r", 1)
		m, err := mustOpen(t, d).Write(ctx, runs)
		if err != nil {
			t.Fatal(err)
		}
		raw := gunzip(t, filepath.Join(root, m.Segment))
		var want bytes.Buffer
		for i := range runs[0].Records {
			line, err := archive.EncodeRecord(&runs[0].Records[i])
			if err != nil {
				t.Fatal(err)
			}
			want.Write(line)
			want.WriteByte('\n')
		}
		if !bytes.Equal(raw, want.Bytes()) {
			t.Fatalf("got segment\n%s\nwant\n%s", raw, want.Bytes())
		}
		if !strings.Contains(string(raw), `"a<b & c>d`) {
			t.Fatalf("payload was escaped: %s", raw)
		}
	})
	t.Run("ReopenChainsOn", func(t *testing.T) {
		d, _ := openDir(t)
		runs := finishedRuns(t, "r", 2)
		m1, err := mustOpen(t, d).Write(ctx, runs[:1])
		if err != nil {
			t.Fatal(err)
		}
		a := mustOpen(t, d)
		if h := a.Head(); h == nil || h.Chain != m1.Chain {
			t.Fatalf("got head %+v, want manifest 1", h)
		}
		m2, err := a.Write(ctx, runs[1:])
		if err != nil {
			t.Fatal(err)
		}
		if m2.Seq != 2 || m2.Prev != m1.Chain {
			t.Fatalf("got seq %d prev %s, want 2 and %s", m2.Seq, m2.Prev, m1.Chain)
		}
	})
	t.Run("ErrInputInvalid", func(t *testing.T) {
		runs := finishedRuns(t, "r", 2)
		other := append([]statestore.RunEventRecord(nil), runs[0].Records...)
		other[1].RunID = "someone-else"
		reversed := append([]statestore.RunEventRecord(nil), runs[0].Records...)
		reversed[0], reversed[1] = reversed[1], reversed[0]
		for name, in := range map[string][]archive.Run{
			"NoRuns":       nil,
			"NoRecords":    {{ID: "x"}},
			"NoID":         {{Records: runs[0].Records}},
			"Twice":        {runs[0], runs[0]},
			"OtherRun":     {{ID: runs[0].ID, Records: other}},
			"OutOfOrder":   {{ID: runs[0].ID, Records: reversed}},
			"OneBadOfMany": {runs[1], {ID: runs[0].ID, Records: reversed}},
		} {
			t.Run(name, func(t *testing.T) {
				d, _ := openDir(t)
				_, err := mustOpen(t, d).Write(ctx, in)
				if !errors.Is(err, archive.ErrInputInvalid) || !errors.Is(err, errcode.Invalid) {
					t.Fatalf("got %v, want ErrInputInvalid", err)
				}
				if names, _ := d.List(ctx, ""); len(names) != 0 {
					t.Fatalf("got objects %v, want none", names)
				}
			})
		}
	})
}

func gunzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestArchive_Records(t *testing.T) {
	ctx := context.Background()
	d, root := openDir(t)
	a := mustOpen(t, d)
	runs := finishedRuns(t, "r", 2)
	m, err := a.Write(ctx, runs)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ErrRunNotFound", func(t *testing.T) {
		_, err := a.Records(ctx, "never-archived")
		if !errors.Is(err, archive.ErrRunNotFound) || !errors.Is(err, errcode.NotFound) {
			t.Fatalf("got %v, want ErrRunNotFound", err)
		}
	})
	t.Run("ErrCorrupt", func(t *testing.T) {
		flipByte(t, filepath.Join(root, m.Segment), 40)
		_, err := a.Records(ctx, runs[1].ID)
		if !errors.Is(err, archive.ErrCorrupt) {
			t.Fatalf("got %v, want ErrCorrupt", err)
		}
	})
}

func flipByte(t testing.TB, path string, at int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at%len(b)] ^= 0x01
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// rewriteManifest decodes manifest seq, lets edit change it, and stores it
// again; with rechain its Chain is recomputed as a forger would.
func rewriteManifest(t testing.TB, root string, seq int, rechain bool, edit func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(root, "manifests", fmt.Sprintf("%012d.json", seq))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m archive.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	edit(generic)
	b, _ = json.Marshal(generic)
	m = archive.Manifest{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if rechain {
		m.Chain = ""
		c, _ := json.Marshal(&m)
		m.Chain = sha256Hex(c)
	}
	out, _ := json.MarshalIndent(&m, "", "  ")
	if err := os.WriteFile(p, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// reseal recompresses a one-run segment with lines changed by edit and
// updates its manifest's sizes and hashes (and the run's), as a forger
// who knows the format would; with rechain its Chain too.
func reseal(t testing.TB, root string, seq int, m *archive.Manifest, rechain bool, edit func(lines []string) []string) {
	t.Helper()
	raw := gunzip(t, filepath.Join(root, m.Segment))
	lines := strings.SplitAfter(strings.TrimSuffix(string(raw), "\n"), "\n")
	for i := range lines {
		lines[i] = strings.TrimSuffix(lines[i], "\n") + "\n"
	}
	lines = edit(lines)
	body := strings.Join(lines, "")
	var comp bytes.Buffer
	zw := gzip.NewWriter(&comp)
	zw.Write([]byte(body))
	zw.Close()
	if err := os.WriteFile(filepath.Join(root, m.Segment), comp.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	rewriteManifest(t, root, seq, rechain, func(g map[string]any) {
		g["segmentSha256"] = sha256Hex(comp.Bytes())
		g["segmentBytes"] = comp.Len()
		g["rawBytes"] = len(body)
		g["records"] = len(lines)
		run := g["runs"].([]any)[0].(map[string]any)
		run["records"] = len(lines)
		run["sha256"] = sha256Hex([]byte(body))
	})
}

func TestVerify(t *testing.T) {
	ctx := context.Background()
	// setup writes three one-run segments.
	setup := func(t *testing.T) (archive.Destination, string, []*archive.Manifest) {
		d, root := openDir(t)
		a := mustOpen(t, d)
		var ms []*archive.Manifest
		for _, r := range finishedRuns(t, "r", 3) {
			m, err := a.Write(ctx, []archive.Run{r})
			if err != nil {
				t.Fatal(err)
			}
			ms = append(ms, m)
		}
		return d, root, ms
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions
		want   []string // problem codes
	}{
		{"Clean", func(*testing.T, string, []*archive.Manifest) archive.VerifyOptions { return archive.VerifyOptions{} }, nil},
		{"SegmentByteFlipped", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			flipByte(t, filepath.Join(root, ms[1].Segment), 30)
			return archive.VerifyOptions{}
		}, []string{archive.ProblemSegmentCorrupt}},
		{"SegmentDeleted", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			os.Remove(filepath.Join(root, ms[1].Segment))
			return archive.VerifyOptions{}
		}, []string{archive.ProblemSegmentMissing}},
		{"RecordDroppedSegmentResealed", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			// The segment and its manifest agree, but the manifest's chain
			// no longer does.
			reseal(t, root, 2, ms[1], false, func(l []string) []string { return append(l[:1], l[2:]...) })
			return archive.VerifyOptions{}
		}, []string{archive.ProblemManifestInvalid}},
		{"RecordAlteredSegmentAndChainResealed", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			// Manifest 2 is consistent in itself; manifest 3 does not chain to it.
			reseal(t, root, 2, ms[1], true, func(l []string) []string {
				l[1] = strings.Replace(l[1], `"StepStarted"`, `"StepSkipped"`, 1)
				return l
			})
			return archive.VerifyOptions{}
		}, []string{archive.ProblemChainBroken}},
		{"SegmentRecordsUnchangedRunCountEdited", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			rewriteManifest(t, root, 1, true, func(g map[string]any) { g["runs"].([]any)[0].(map[string]any)["records"] = 3 })
			return archive.VerifyOptions{}
		}, []string{archive.ProblemSegmentCorrupt, archive.ProblemChainBroken}},
		{"ManifestDeleted", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			os.Remove(filepath.Join(root, "manifests", "000000000002.json"))
			return archive.VerifyOptions{}
		}, []string{archive.ProblemManifestMissing}},
		{"StrayManifestFarAhead", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			// One problem for the gap below it, not one per missing number.
			os.WriteFile(filepath.Join(root, "manifests", "100000000000.json"), []byte("{}"), 0o600)
			return archive.VerifyOptions{}
		}, []string{archive.ProblemManifestMissing, archive.ProblemManifestInvalid}},
		{"ManifestGarbage", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			os.WriteFile(filepath.Join(root, "manifests", "000000000001.json"), []byte("{not json"), 0o600)
			return archive.VerifyOptions{}
		}, []string{archive.ProblemManifestInvalid}},
		{"NewestManifestDroppedHeadKnown", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			os.Remove(filepath.Join(root, "manifests", "000000000003.json"))
			os.Remove(filepath.Join(root, ms[2].Segment))
			return archive.VerifyOptions{ExpectHead: ms[2].Chain}
		}, []string{archive.ProblemHeadMismatch}},
		{"OlderHeadStillInChain", func(t *testing.T, root string, ms []*archive.Manifest) archive.VerifyOptions {
			return archive.VerifyOptions{ExpectHead: ms[0].Chain}
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, root, ms := setup(t)
			opts := tc.damage(t, root, ms)
			rep := mustVerify(t, d, opts)
			var got []string
			for _, p := range rep.Problems {
				got = append(got, p.Code)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got problems %+v, want codes %v", rep.Problems, tc.want)
			}
		})
	}
	t.Run("RunCopies", func(t *testing.T) {
		// A run archived again with the same names (the sidecar's second
		// copy) verifies; a later copy, well formed and chained, that
		// names another tenant is not the writer's: reported.
		d, _, _ := setup(t)
		a := mustOpen(t, d)
		run := finishedRuns(t, "r", 1)[0]
		if _, err := a.Write(ctx, []archive.Run{run}); err != nil {
			t.Fatal(err)
		}
		if rep := mustVerify(t, d, archive.VerifyOptions{}); len(rep.Problems) != 0 {
			t.Fatalf("a second copy with the same names: %+v, want no problem", rep.Problems)
		}
		forged := archive.Run{ID: run.ID}
		for _, r := range run.Records {
			r.TenantID = "another-tenant"
			forged.Records = append(forged.Records, r)
		}
		if _, err := a.Write(ctx, []archive.Run{forged}); err != nil {
			t.Fatal(err)
		}
		rep := mustVerify(t, d, archive.VerifyOptions{})
		if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemRunCopiesDisagree || rep.Problems[0].Seq != 5 ||
			!strings.Contains(rep.Problems[0].Message, "another-tenant") {
			t.Fatalf("a copy naming another tenant: %+v, want one %s at manifest 5", rep.Problems, archive.ProblemRunCopiesDisagree)
		}
	})
	t.Run("Orphans", func(t *testing.T) {
		d, _, _ := setup(t)
		if err := d.Put(ctx, "segments/1-dead.ndjson.gz", []byte("x")); err != nil {
			t.Fatal(err)
		}
		rep := mustVerify(t, d, archive.VerifyOptions{})
		if len(rep.Problems) != 0 || !reflect.DeepEqual(rep.Orphans, []string{"segments/1-dead.ndjson.gz"}) {
			t.Fatalf("got %+v, want one orphan and no problem", rep)
		}
	})
	t.Run("NoDirectory", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "archive")
		d := archive.NewDir(root)
		if rep, err := archive.Verify(ctx, d, archive.VerifyOptions{AllowEmpty: true}); !errors.Is(err, archive.ErrUnavailable) || !strings.Contains(err.Error(), root) {
			t.Fatalf("got %+v, %v; want ErrUnavailable naming %s", rep, err, root)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		d, _ := openDir(t)
		rep := mustVerify(t, d, archive.VerifyOptions{})
		if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemArchiveEmpty || !strings.Contains(rep.Problems[0].Message, d.String()) ||
			rep.Manifests != 0 || rep.Head != "" {
			t.Fatalf("got %+v, want one problem %s naming %s", rep, archive.ProblemArchiveEmpty, d)
		}
		if rep := mustVerify(t, d, archive.VerifyOptions{AllowEmpty: true}); len(rep.Problems) != 0 {
			t.Fatalf("AllowEmpty: got %+v, want no problem", rep)
		}
	})
	t.Run("OrphansOnly", func(t *testing.T) {
		d, _ := openDir(t)
		if err := d.Put(ctx, "segments/1-dead.ndjson.gz", []byte("x")); err != nil {
			t.Fatal(err)
		}
		for _, allow := range []bool{false, true} {
			rep := mustVerify(t, d, archive.VerifyOptions{AllowEmpty: allow})
			if (len(rep.Problems) == 0) != allow || !reflect.DeepEqual(rep.Orphans, []string{"segments/1-dead.ndjson.gz"}) {
				t.Fatalf("AllowEmpty %v: got %+v, want one orphan and %s unless allowed", allow, rep, archive.ProblemArchiveEmpty)
			}
		}
	})
	t.Run("ManifestsAllRemoved", func(t *testing.T) {
		d, root, ms := setup(t)
		if err := os.RemoveAll(filepath.Join(root, "manifests")); err != nil {
			t.Fatal(err)
		}
		rep := mustVerify(t, d, archive.VerifyOptions{})
		if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemArchiveEmpty || len(rep.Orphans) != len(ms) {
			t.Fatalf("got %+v, want %s and %d orphans", rep, archive.ProblemArchiveEmpty, len(ms))
		}
	})
}

// A run of a manifest rewritten, hash and all, by a writer without the
// signing key (the manifest after it no longer names it as its
// predecessor) is not read as genuine: by a process that wrote the archive
// and by one that just started, reading it by id answers ARCHIVE_CORRUPT,
// as the listing passes over it and verify reports ARCHIVE_CHAIN_BROKEN.
// The runs of the other manifests read as before. Before, the re-sealed
// records were answered as the run's.
func TestArchive_ResealedManifestIsNotRead(t *testing.T) {
	ctx := context.Background()
	d, a, runs, _ := resealedSecond(t, 3)
	for name, reader := range map[string]*archive.Archive{"the writer": a, "a process that just started": mustOpen(t, d)} {
		t.Run(name, func(t *testing.T) {
			if recs, err := reader.Records(ctx, runs[1].ID); !errors.Is(err, archive.ErrCorrupt) {
				t.Fatalf("the re-sealed run: %d records, %v; want ARCHIVE_CORRUPT", len(recs), err)
			}
			for _, i := range []int{0, 2} {
				if recs, err := reader.Records(ctx, runs[i].ID); err != nil || len(recs) != len(runs[i].Records) {
					t.Fatalf("run of manifest %d: %d records, %v; want its %d", i+1, len(recs), err, len(runs[i].Records))
				}
			}
		})
	}
}

// The newest manifest re-sealed has no manifest after it to name it: a
// process that just started knows it only from the head hot state noted
// (Expect), and reads it as not genuine when its chain is not that one.
// The process that wrote it knows from its own write. Before, a process
// that just started read the re-sealed records as the run's (the head it
// read from the destination, the forged one, was its reference).
func TestArchive_ResealedNewestManifestIsNotRead(t *testing.T) {
	ctx := context.Background()
	d, a, runs, ms := resealedSecond(t, 2)
	restarted := mustOpen(t, d)
	restarted.Expect(ms[1].Seq, ms[1].Chain) // as hot state noted it
	for name, reader := range map[string]*archive.Archive{"the writer": a, "a process that just started": restarted} {
		t.Run(name, func(t *testing.T) {
			if recs, err := reader.Records(ctx, runs[1].ID); !errors.Is(err, archive.ErrCorrupt) {
				t.Fatalf("the re-sealed run of the newest manifest: %d records, %v; want ARCHIVE_CORRUPT", len(recs), err)
			}
			if recs, err := reader.Records(ctx, runs[0].ID); err != nil || len(recs) != len(runs[0].Records) {
				t.Fatalf("the run of manifest 1: %d records, %v", len(recs), err)
			}
		})
	}
}

// resealedSecond writes n one-run manifests with a, then re-seals the
// second, hash and chain, with one record changed (as a writer without the
// signing key would).
func resealedSecond(t *testing.T, n int) (d archive.Destination, a *archive.Archive, runs []archive.Run, ms []*archive.Manifest) {
	t.Helper()
	dir, root := openDir(t)
	a = mustOpen(t, dir)
	runs = finishedRuns(t, "r", n)
	for _, r := range runs {
		m, err := a.Write(context.Background(), []archive.Run{r})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	reseal(t, root, 2, ms[1], true, func(l []string) []string {
		l[1] = strings.Replace(l[1], `"StepStarted"`, `"StepSkipped"`, 1)
		return l
	})
	return dir, a, runs, ms
}

// A process whose archive head, read at its start, is not the one hot
// state noted (a newest manifest forged, hash and all) does not chain a
// manifest on to it; once the genuine one is put back, it chains on to
// that one without a restart. Before, Write chained on to the forged head
// (retention's own check of the noted head stood in front of it), and once
// the genuine one was back, refused it until the process restarted.
func TestArchive_WriteChainsOnlyOntoTheNotedHead(t *testing.T) {
	ctx := context.Background()
	dir, root := openDir(t)
	a := mustOpen(t, dir)
	var ms []*archive.Manifest
	for _, r := range finishedRuns(t, "r", 2) {
		m, err := a.Write(ctx, []archive.Run{r})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	name := filepath.Join(root, "manifests", fmt.Sprintf("%012d.json", 2))
	genuine, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	reseal(t, root, 2, ms[1], true, func(l []string) []string {
		l[1] = strings.Replace(l[1], `"StepStarted"`, `"StepSkipped"`, 1)
		return l
	})
	b := mustOpen(t, dir) // reads the forged head
	b.Expect(ms[1].Seq, ms[1].Chain)
	next := finishedRuns(t, "n", 1)
	if m, err := b.Write(ctx, next); !errors.Is(err, archive.ErrCorrupt) {
		t.Fatalf("a write on the forged head: %+v %v, want ARCHIVE_CORRUPT and nothing written", m, err)
	}
	if err := os.WriteFile(name, genuine, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := b.Write(ctx, next)
	if err != nil || m.Seq != 3 || m.Prev != ms[1].Chain {
		t.Fatalf("a write once the genuine head is back: %+v %v, want manifest 3 chained on to manifest 2", m, err)
	}
}
