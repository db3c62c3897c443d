package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// chainVersion is the first schema version with the hash chain
// (migrations/0004).
const chainVersion = 4

// pgEpoch is PostgreSQL's timestamp epoch, 2000-01-01 UTC, in Unix
// microseconds: timestamptz_send counts from it.
const pgEpoch = 946684800000000

// genesis is the chain hash a run's first record chains from.
var genesis = make([]byte, sha256.Size)

// ChainHash is the chain hash of a record: SHA-256 of prev (the chain hash
// of the run's previous record, 32 zero bytes for the first) and the
// record's canonical bytes: runSeq, logSeq and persistedAt (microseconds
// since 2000-01-01 UTC) as 8-byte big-endian integers, then runId,
// idempotencyKey, eventId, eventType and the stored body, each as a 4-byte
// big-endian length and its UTF-8 bytes. The database computes the same
// (run_event_chain, migrations/0004).
func ChainHash(prev []byte, runID string, runSeq, logSeq int64, persistedAt time.Time, key, eventID, eventType, body string) []byte {
	h := sha256.New()
	h.Write(prev)
	var n [8]byte
	for _, v := range []int64{runSeq, logSeq, persistedAt.UnixMicro() - pgEpoch} {
		binary.BigEndian.PutUint64(n[:], uint64(v))
		h.Write(n[:])
	}
	for _, f := range []string{runID, key, eventID, eventType, body} {
		binary.BigEndian.PutUint32(n[:4], uint32(len(f)))
		h.Write(n[:4])
		_, _ = io.WriteString(h, f)
	}
	return h.Sum(nil)
}

// Broken is a run whose records do not verify: the first problem found.
type Broken struct {
	RunID string `json:"runId"`
	// Code is LOG_RECORD_MISSING, LOG_CHAIN_BROKEN or RUN_NOT_FOUND.
	Code    string `json:"code"`
	RunSeq  int64  `json:"runSeq,omitempty"`
	Message string `json:"message"`
}

// Verified is what Verify found.
type Verified struct {
	Runs    int      `json:"runs"`
	Records int64    `json:"records"`
	Broken  []Broken `json:"broken"`
}

// Verify recomputes the hash chain of the runs runIDs (every run when
// none) in this binary, from the records as the database returns them,
// and reports each run that does not verify: a runSeq missing between 1
// and the run's last (LOG_RECORD_MISSING), a record whose stored chain
// hash is not the one recomputed (LOG_CHAIN_BROKEN: the record or one
// before it changed), a run the log does not have (RUN_NOT_FOUND). It
// reads only (SELECT on runs and run_events: the runtime role will do) and
// is sidecar verify. An owner who recomputed every chain hash after a
// change passes; docs/postgres.md says what catches that.
func Verify(ctx context.Context, url string, runIDs []string) (Verified, error) {
	var out Verified
	cfg, err := parseURL(url, "--store")
	if err != nil {
		return out, err
	}
	cfg.MaxConns = 1
	pool, err := connect(ctx, cfg, "--store")
	if err != nil {
		return out, err
	}
	defer pool.Close()
	r, err := readRoles(ctx, pool)
	if err != nil {
		return out, err
	}
	if all, err := migrations(); err != nil {
		return out, err
	} else if latest := all[len(all)-1].version; r.version > latest {
		return out, schemaNewer(r.version, latest)
	}
	if r.version < chainVersion {
		return out, &statestore.Error{Code: CodeMigrationNeeded, Message: fmt.Sprintf(
			"the database's schema is at version %d, before the hash chain (%d): run sidecar migrate --store postgres://OWNER@host:port/database first", r.version, chainVersion)}
	}
	filter, args := "", []any{}
	if len(runIDs) > 0 {
		filter, args = " WHERE run_id = ANY($1)", []any{runIDs}
	}
	lasts := map[string]int64{}
	rows, err := pool.Query(ctx, "SELECT run_id, last_seq FROM runs"+filter, args...)
	if err != nil {
		return out, unavailable("verify: read runs", err)
	}
	var run string
	var last int64
	if _, err := pgx.ForEachRow(rows, []any{&run, &last}, func() error { lasts[run] = last; return nil }); err != nil {
		return out, unavailable("verify: read runs", err)
	}

	var (
		cur  string
		walk runWalk
		rec  chainRow
		seen = map[string]bool{}
	)
	report := func(b Broken) { out.Broken = append(out.Broken, b) }
	endRun := func() {
		if cur == "" {
			return
		}
		if walk.broken == nil && lasts[cur] >= walk.next {
			report(Broken{RunID: cur, Code: CodeRecordMissing, RunSeq: walk.next,
				Message: fmt.Sprintf("runSeq %d to %d are missing: the run's last append was runSeq %d", walk.next, lasts[cur], lasts[cur])})
		}
		out.Runs++
	}
	rows, err = pool.Query(ctx, "SELECT "+chainColumns+" FROM run_events"+filter+" ORDER BY run_id, run_seq", args...)
	if err != nil {
		return out, unavailable("verify: read run_events", err)
	}
	_, err = pgx.ForEachRow(rows, rec.dest(), func() error {
		if rec.run != cur {
			endRun()
			cur, walk = rec.run, runWalk{}
			seen[cur] = true
		}
		out.Records++
		if b := walk.step(&rec); b != nil {
			report(*b)
		}
		return nil
	})
	if err != nil {
		return out, unavailable("verify: read run_events", err)
	}
	endRun()
	for _, id := range slices.Sorted(maps.Keys(lasts)) {
		if !seen[id] && lasts[id] > 0 {
			report(Broken{RunID: id, Code: CodeRecordMissing, RunSeq: 1,
				Message: fmt.Sprintf("every record is missing: the run's last append was runSeq %d", lasts[id])})
			out.Runs++
		}
		seen[id] = true
	}
	for _, id := range runIDs {
		if !seen[id] {
			report(Broken{RunID: id, Code: CodeRunNotFound, Message: "the log has no run " + id})
			seen[id] = true
		}
	}
	return out, nil
}

// chainColumns are the columns a chainRow scans.
const chainColumns = "run_events.run_id, run_events.run_seq, run_events.log_seq, run_events.persisted_at, run_events.idempotency_key, " +
	"run_events.event_id, run_events.event_type, run_events.body, run_events.chain_hash"

// chainRow is a record as the chain covers it.
type chainRow struct {
	run, key, id, typ, body string
	seq, logSeq             int64
	at                      time.Time
	chain                   []byte
}

func (r *chainRow) dest() []any {
	return []any{&r.run, &r.seq, &r.logSeq, &r.at, &r.key, &r.id, &r.typ, &r.body, &r.chain}
}

// runWalk checks one run's records, given in runSeq order, against the
// chain: each must be the next runSeq and carry the chain hash recomputed
// from the previous one. It stops at the first that does not (broken).
type runWalk struct {
	prev   []byte
	next   int64
	broken *Broken
}

// step checks r and returns the run's first problem when r is it.
func (w *runWalk) step(r *chainRow) *Broken {
	if w.broken != nil {
		return nil
	}
	if w.next == 0 {
		w.prev, w.next = genesis, 1
	}
	switch {
	case r.seq != w.next:
		w.broken = &Broken{RunID: r.run, Code: CodeRecordMissing, RunSeq: w.next,
			Message: fmt.Sprintf("runSeq %d is missing (the next record is runSeq %d)", w.next, r.seq)}
	case !bytes.Equal(ChainHash(w.prev, r.run, r.seq, r.logSeq, r.at, r.key, r.id, r.typ, r.body), r.chain):
		w.broken = &Broken{RunID: r.run, Code: CodeChainBroken, RunSeq: r.seq,
			Message: fmt.Sprintf("the record at runSeq %d (%s, eventId %s) is not the one its chain hash was computed over: it was changed", r.seq, r.typ, r.id)}
	default:
		w.prev, w.next = append([]byte(nil), r.chain...), w.next+1
	}
	return w.broken
}
