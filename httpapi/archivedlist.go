package httpapi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// IncludeArchived is the value of GET /v1/runs' include parameter that
// lists the archived runs after those in hot state.
const IncludeArchived = "archived"

// maxManifestsPerPage bounds the manifests one page of archived runs
// reads: a filter that matches few archived runs answers a short (even
// empty) page with a continue token rather than reading the whole archive
// in one request.
const maxManifestsPerPage = 20

// archivePrefix starts the continue token of a listing that has reached
// the archive: "archived" (from the newest manifest) or
// "archived.<manifest seq>.<entry index>" (the next entry to look at).
const archivePrefix = "archived"

// archivePos is where a listing of archived runs goes on: manifest seq,
// entry index (-1: from the manifest's last entry; seq 0: from the newest
// manifest).
type archivePos struct {
	seq uint64
	i   int
}

func (p archivePos) token() string {
	if p.seq == 0 {
		return archivePrefix // from the newest manifest
	}
	return archivePrefix + "." + strconv.FormatUint(p.seq, 10) + "." + strconv.Itoa(p.i)
}

// parseArchivePos reads a continue token of the archive part of a listing.
func parseArchivePos(tok string) (archivePos, bool) {
	if tok == archivePrefix {
		return archivePos{i: -1}, true
	}
	rest, ok := strings.CutPrefix(tok, archivePrefix+".")
	if !ok {
		return archivePos{}, false
	}
	a, b, ok := strings.Cut(rest, ".")
	seq, err1 := strconv.ParseUint(a, 10, 64)
	i, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || seq == 0 || i < -1 {
		return archivePos{}, false
	}
	return archivePos{seq: seq, i: i}, true
}

// listArchived appends to out the archived runs matching f from pos on,
// newest manifest first and, within one, its last entry first, until out
// holds limit runs or maxManifestsPerPage manifests were read; it sets
// out.Continue when the archive has more.
func (s *Server) listArchived(ctx context.Context, f runlist.Filter, limit int, pos archivePos, out *RunList) error {
	seqs, err := s.opts.Archive.ManifestSeqs(ctx)
	if err != nil {
		return err
	}
	// k: the newest manifest at or before pos.
	k := len(seqs) - 1
	if pos.seq > 0 {
		k = sort.Search(len(seqs), func(j int) bool { return seqs[j] > pos.seq }) - 1
		if k < 0 || seqs[k] != pos.seq {
			pos.i = -1
		}
	}
	// next is the manifest after seqs[k] (the one read before it, or for
	// a page that starts mid-archive, read first): its Prev must be the
	// Chain of seqs[k], or seqs[k] was rewritten, hash and all, by a
	// writer without the signing key (archive verify reports it).
	var next *archive.Manifest
	if k >= 0 && k+1 < len(seqs) && seqs[k+1] == seqs[k]+1 {
		next, _ = s.opts.Archive.Manifest(ctx, seqs[k+1])
	}
	for read := 0; k >= 0; k-- {
		if read == maxManifestsPerPage {
			out.Continue = archivePos{seq: seqs[k], i: -1}.token()
			return nil
		}
		m, err := s.opts.Archive.Manifest(ctx, seqs[k])
		read++
		if err == nil && next != nil {
			err = archive.Follows(m, next)
		}
		next = m
		if err != nil {
			if errors.Is(err, archive.ErrUnavailable) || ctx.Err() != nil {
				return fmt.Errorf("read archive manifest %d: %w", seqs[k], err)
			}
			// One damaged manifest passes over its own runs, not every
			// tenant's listing: the page says which it passed over.
			out.Unreadable = append(out.Unreadable, UnreadableManifest{From: seqs[k], Through: seqs[k], Code: s.classify(err).Code})
			s.log.Warn("an archive manifest cannot be read; the listing of archived runs passes over its runs",
				zap.Uint64("manifest", seqs[k]), zap.Error(err))
			missingBelow(seqs, k, out)
			continue
		}
		i := len(m.Runs) - 1
		if seqs[k] == pos.seq && pos.i >= 0 && pos.i < len(m.Runs) {
			i = pos.i
		}
		for ; i >= 0; i-- {
			if len(out.Runs) == limit {
				out.Continue = archivePos{seq: seqs[k], i: i}.token()
				return nil
			}
			row, err := s.archivedRow(ctx, &m.Runs[i])
			if err != nil {
				return err
			}
			if !f.Match(&row) {
				continue
			}
			if once, err := s.listedOnce(ctx, row.RunID, seqs[k], seqs[len(seqs)-1]); err != nil || !once {
				if err != nil {
					return err
				}
				continue
			}
			out.Runs = append(out.Runs, ListedRun{Row: row, Archived: true})
		}
		missingBelow(seqs, k, out)
	}
	return nil
}

// missingBelow adds to out's unreadable manifests those missing between
// seqs[k] and the manifest before it (or the first): the listing passed
// over them as it left manifest seqs[k].
func missingBelow(seqs []uint64, k int, out *RunList) {
	below := uint64(0)
	if k > 0 {
		below = seqs[k-1]
	}
	if below+1 < seqs[k] {
		out.Unreadable = append(out.Unreadable, UnreadableManifest{From: below + 1, Through: seqs[k] - 1, Code: archive.ProblemManifestMissing})
	}
}

// listedOnce reports whether the archived copy of runID in manifest seq
// is where the run is listed: not while the run list still has its row
// (listed from hot state, as it moves from hot state to the archive), and
// only from its newest copy (through: the archive's newest manifest).
func (s *Server) listedOnce(ctx context.Context, runID string, seq, through uint64) (bool, error) {
	newest, err := s.opts.Archive.NewestSeq(ctx, runID, through)
	if err != nil {
		return false, fmt.Errorf("locate run %q in the archive: %w", runID, err)
	}
	if newest != seq {
		return false, nil
	}
	hot, err := s.opts.List.HasRow(ctx, runID)
	return !hot, err
}

// archivedRow is the run list row of an archived run, from its manifest
// entry; only a run whose last archived record is not its terminal event
// (a step that ended after a cancel) is projected from its records.
func (s *Server) archivedRow(ctx context.Context, e *archive.RunEntry) (runlist.Row, error) {
	row := runlist.Row{RunID: e.RunID, TenantID: e.TenantID, ProjectID: e.ProjectID, EnvironmentID: e.EnvironmentID,
		PlanID: e.PlanID, PlanVersion: e.PlanVersion, CreatedAt: e.FirstPersistedAt,
		LastEventSeq: e.LastRunSeq, UpdatedAt: e.LastPersistedAt, Labels: e.Labels}
	switch e.LastEventType {
	case statestore.RunCompleted:
		row.Status = statestore.RunStatusCompleted
	case statestore.RunFailed:
		row.Status = statestore.RunStatusFailed
	case statestore.RunCancelled:
		row.Status = statestore.RunStatusCancelled
	default:
		recs, err := s.archivedRecords(ctx, e.RunID)
		if err != nil {
			return row, err
		}
		snap, _ := statestore.Reduce(nil, recs)
		row.Status = snap.Status
		return row, nil
	}
	row.CompletedAt = e.LastPersistedAt
	return row, nil
}
