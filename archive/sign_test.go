package archive_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
)

func mustKeys(t testing.TB, lines ...string) *archive.Keys {
	t.Helper()
	ks, err := archive.ParseKeys([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// writeRuns writes one one-run segment a run of runs through an Archive
// opened on d with keys (nil: none).
func writeRuns(t testing.TB, d archive.Destination, keys *archive.Keys, runs []archive.Run) []*archive.Manifest {
	t.Helper()
	a, err := archive.Open(context.Background(), d, archive.Options{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	var ms []*archive.Manifest
	for _, r := range runs {
		m, err := a.Write(context.Background(), []archive.Run{r})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	return ms
}

func problemAt(rep *archive.Report) []string {
	var got []string
	for _, p := range rep.Problems {
		got = append(got, fmt.Sprintf("%s@%d", p.Code, p.Seq))
	}
	return got
}

const (
	key1 = "0123456789abcdef0123456789abcdef-first"
	key2 = "fedcba9876543210fedcba9876543210-second"
)

// What a key proves: with the keys, verify accepts only manifests a key
// holder wrote, from the first signed one on; someone who can write to the
// archive but holds no key can neither add a manifest nor rewrite the
// newest ones, although what they write chains and hashes correctly.
func TestVerify_Signed(t *testing.T) {
	ctx := context.Background()
	k1, k2 := mustKeys(t, key1), mustKeys(t, key2)
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, d archive.Destination, root string)
		keys  *archive.Keys
		want  []string
		// signed and first: the report's Signed and FirstSigned.
		signed int64
		first  uint64
	}{
		{"Clean", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 3))
		}, k1, nil, 3, 1},
		{"WrittenBeforeItHadKeys", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, nil, finishedRuns(t, "a", 2))
			writeRuns(t, d, k1, finishedRuns(t, "b", 2))
		}, k1, nil, 2, 3},
		{"AddedWithoutTheKey", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 3))
			writeRuns(t, d, nil, finishedRuns(t, "forged", 1))
		}, k1, []string{archive.ProblemManifestUnsigned + "@4"}, 3, 1},
		{"AddedWithAnotherKey", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 3))
			writeRuns(t, d, mustKeys(t, key2, key1), finishedRuns(t, "forged", 1))
		}, k1, []string{archive.ProblemSignatureInvalid + "@4"}, 3, 1},
		{"NewestRewrittenWithoutTheKey", func(t *testing.T, d archive.Destination, root string) {
			ms := writeRuns(t, d, k1, finishedRuns(t, "a", 3))
			for _, m := range ms[1:] {
				os.Remove(filepath.Join(root, "manifests", fmt.Sprintf("%012d.json", m.Seq)))
				os.Remove(filepath.Join(root, m.Segment))
			}
			writeRuns(t, d, nil, finishedRuns(t, "forged", 2))
		}, k1, []string{archive.ProblemManifestUnsigned + "@2", archive.ProblemManifestUnsigned + "@3"}, 1, 1},
		{"AllRewrittenWithoutTheKey", func(t *testing.T, d archive.Destination, root string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 2))
			os.RemoveAll(root)
			os.Mkdir(root, 0o750)
			writeRuns(t, d, nil, finishedRuns(t, "forged", 2))
		}, k1, []string{archive.ProblemManifestUnsigned + "@0"}, 0, 0},
		{"MACEdited", func(t *testing.T, d archive.Destination, root string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 3))
			editSignature(t, root, 2)
		}, k1, []string{archive.ProblemSignatureInvalid + "@2"}, 2, 1},
		{"RotatedKeysBothGiven", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 2))
			writeRuns(t, d, mustKeys(t, key2, key1), finishedRuns(t, "b", 2))
		}, mustKeys(t, key2, key1), nil, 4, 1},
		{"RotatedKeyDropped", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 2))
			writeRuns(t, d, mustKeys(t, key2, key1), finishedRuns(t, "b", 2))
		}, k2, []string{archive.ProblemSignatureInvalid + "@1", archive.ProblemSignatureInvalid + "@2"}, 2, 3},
		{"SignedButNoKeysGiven", func(t *testing.T, d archive.Destination, _ string) {
			writeRuns(t, d, k1, finishedRuns(t, "a", 2))
			writeRuns(t, d, nil, finishedRuns(t, "b", 1))
		}, nil, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, root := openDir(t)
			tc.write(t, d, root)
			rep := mustVerify(t, d, archive.VerifyOptions{Keys: tc.keys})
			if got := problemAt(rep); !reflect.DeepEqual(got, tc.want) || rep.Signed != tc.signed || rep.FirstSigned != tc.first {
				t.Fatalf("problems %v, signed %d from %d; want %v, signed %d from %d\n%+v", got, rep.Signed, rep.FirstSigned, tc.want, tc.signed, tc.first, rep.Problems)
			}
		})
	}

	t.Run("Reads", func(t *testing.T) {
		// An Archive with keys refuses to read a run through a manifest
		// whose signature does not check; without keys it reads it.
		d, root := openDir(t)
		runs := finishedRuns(t, "a", 3)
		writeRuns(t, d, k1, runs)
		editSignature(t, root, 2)
		for _, keys := range []*archive.Keys{k1, nil} {
			a, err := archive.Open(ctx, d, archive.Options{Keys: keys})
			if err != nil {
				t.Fatal(err)
			}
			_, err = a.Records(ctx, runs[1].ID)
			if wantErr := keys != nil; wantErr != errors.Is(err, archive.ErrCorrupt) {
				t.Fatalf("keys %v: Records of the run of the edited manifest: %v", keys != nil, err)
			}
		}
	})

	t.Run("WriterWithoutTheHeadsKey", func(t *testing.T) {
		// A writer whose keys do not include the one the newest manifest
		// was signed with (a key rotated out of the file too early) does
		// not chain on to it: it cannot tell it from a forgery.
		d, _ := openDir(t)
		writeRuns(t, d, k1, finishedRuns(t, "a", 1))
		_, err := archive.Open(ctx, d, archive.Options{Keys: k2})
		if !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), k1.SigningKeyID()) {
			t.Fatalf("Open with another key: %v, want ErrCorrupt naming key %s", err, k1.SigningKeyID())
		}
	})
}

// TestSigned_UnsignedAfterSigned: with the keys, a manifest written without
// them after signed ones (by someone who can write to the archive but
// holds no key: it hashes and chains correctly) is neither chained on to
// by a writer, who would sign over it, nor read, which would answer its
// runs as it says (another tenant's, say). An archive written before it
// had keys still opens and reads with them, its head unsigned or not.
func TestSigned_UnsignedAfterSigned(t *testing.T) {
	ctx := context.Background()
	k1 := mustKeys(t, key1)
	t.Run("WriterDoesNotChainOnToIt", func(t *testing.T) {
		for _, forged := range []int{1, 3} {
			d, _ := openDir(t)
			writeRuns(t, d, k1, finishedRuns(t, "a", 2))
			writeRuns(t, d, nil, finishedRuns(t, "forged", forged))
			_, err := archive.Open(ctx, d, archive.Options{Keys: k1})
			if !errors.Is(err, archive.ErrCorrupt) || !strings.Contains(err.Error(), "manifest 3 is not signed, and manifest 2 before it is") &&
				!strings.Contains(err.Error(), "manifest 5 is not signed, and manifest 2 before it is") {
				t.Fatalf("%d forged: Open with the keys: %v, want ErrCorrupt naming the unsigned manifest and the signed one before it", forged, err)
			}
		}
	})
	t.Run("NotReadByAWriterThatWasOpenBefore", func(t *testing.T) {
		d, _ := openDir(t)
		a, err := archive.Open(ctx, d, archive.Options{Keys: k1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Write(ctx, finishedRuns(t, "a", 1)); err != nil {
			t.Fatal(err)
		}
		forged := finishedRuns(t, "forged", 2)
		writeRuns(t, d, nil, forged)
		for _, r := range forged {
			if _, err := a.Records(ctx, r.ID); !errors.Is(err, archive.ErrCorrupt) {
				t.Fatalf("Records of run %s of an unsigned manifest: %v, want ErrCorrupt", r.ID, err)
			}
		}
		if _, err := a.Write(ctx, finishedRuns(t, "b", 1)); !errors.Is(err, archive.ErrCorrupt) {
			t.Fatalf("Write after the unsigned manifest: %v, want ErrCorrupt", err)
		}
	})
	t.Run("WrittenBeforeItHadKeys", func(t *testing.T) {
		d, _ := openDir(t)
		old := finishedRuns(t, "old", 3)
		writeRuns(t, d, nil, old)
		a, err := archive.Open(ctx, d, archive.Options{Keys: k1})
		if err != nil {
			t.Fatalf("Open with keys of an archive written without: %v", err)
		}
		if _, err := a.Records(ctx, old[0].ID); err != nil {
			t.Fatalf("Records of a run written before the keys: %v", err)
		}
		if _, err := a.Write(ctx, finishedRuns(t, "new", 1)); err != nil {
			t.Fatal(err)
		}
		b, err := archive.Open(ctx, d, archive.Options{Keys: k1})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range old {
			if _, err := b.Records(ctx, r.ID); err != nil {
				t.Fatalf("Records of %s (written before the keys) after a signed manifest: %v", r.ID, err)
			}
		}
	})
}

// editSignature changes one hex digit of manifest seq's MAC, leaving the
// rest of the manifest (and so its Chain) as it is.
func editSignature(t testing.TB, root string, seq int) {
	t.Helper()
	p := filepath.Join(root, "manifests", fmt.Sprintf("%012d.json", seq))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), `"mac":"`)
	if i < 0 {
		t.Fatalf("manifest %d is not signed: %s", seq, b)
	}
	at := i + len(`"mac":"`)
	if b[at] == '0' {
		b[at] = '1'
	} else {
		b[at] = '0'
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestParseKeys(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		ids        int
		wantErr    string
	}{
		{"One", key1 + "\n", 1, ""},
		{"CommentsBlanksAndSpaces", "# rotated 2026\n\n  " + key2 + "  \n" + key1, 2, ""},
		{"Short", "too-short\n", 0, "line 1 has 9 bytes"},
		{"Twice", key1 + "\n" + key1, 0, "line 2 is the key on line 1"},
		{"None", "# nothing\n\n", 0, "no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := archive.ParseKeys([]byte(tc.file))
			if tc.wantErr != "" {
				if !errors.Is(err, archive.ErrInputInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want ErrInputInvalid with %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), key1) {
					t.Fatalf("the error shows the key: %v", err)
				}
				return
			}
			if err != nil || len(ks.IDs()) != tc.ids {
				t.Fatalf("got %v, %v; want %d keys", ks, err, tc.ids)
			}
		})
	}
	// The first key signs; ids do not show the keys.
	ks := mustKeys(t, key2, key1)
	if ks.SigningKeyID() != mustKeys(t, key2).SigningKeyID() || strings.Contains(ks.SigningKeyID(), "fedcba") {
		t.Fatalf("signing key id %s", ks.SigningKeyID())
	}
}
