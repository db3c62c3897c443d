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
	"github.com/jackc/pgx/v5/pgxpool"

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
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return out, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "parse the PostgreSQL URL (postgres://user:password@host:port/database)", Err: err}
	}
	cfg.MaxConns = 1
	pool, err := connect(ctx, cfg)
	if err != nil {
		return out, err
	}
	defer pool.Close()
	r, err := readRoles(ctx, pool)
	if err != nil {
		return out, err
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
		cur    string
		prev   []byte
		next   int64
		broken bool
		seen   = map[string]bool{}
		endRun func()
		rec    struct {
			run, key, id, typ, body string
			seq, logSeq             int64
			at                      time.Time
			chain                   []byte
		}
	)
	report := func(code string, seq int64, msg string) {
		out.Broken = append(out.Broken, Broken{RunID: cur, Code: code, RunSeq: seq, Message: msg})
		broken = true
	}
	endRun = func() {
		if cur == "" {
			return
		}
		if !broken && lasts[cur] >= next {
			report(CodeRecordMissing, next, fmt.Sprintf("runSeq %d to %d are missing: the run's last append was runSeq %d", next, lasts[cur], lasts[cur]))
		}
		out.Runs++
	}
	rows, err = pool.Query(ctx, `SELECT run_id, run_seq, log_seq, persisted_at, idempotency_key, event_id, event_type, body, chain_hash
		FROM run_events`+filter+" ORDER BY run_id, run_seq", args...)
	if err != nil {
		return out, unavailable("verify: read run_events", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&rec.run, &rec.seq, &rec.logSeq, &rec.at, &rec.key, &rec.id, &rec.typ, &rec.body, &rec.chain}, func() error {
		if rec.run != cur {
			endRun()
			cur, prev, next, broken = rec.run, genesis, 1, false
			seen[cur] = true
		}
		out.Records++
		if broken {
			return nil
		}
		if rec.seq != next {
			report(CodeRecordMissing, next, fmt.Sprintf("runSeq %d is missing (the next record is runSeq %d)", next, rec.seq))
			return nil
		}
		if want := ChainHash(prev, rec.run, rec.seq, rec.logSeq, rec.at, rec.key, rec.id, rec.typ, rec.body); !bytes.Equal(want, rec.chain) {
			report(CodeChainBroken, rec.seq, fmt.Sprintf("the record at runSeq %d (%s, eventId %s) is not the one its chain hash was computed over: it was changed", rec.seq, rec.typ, rec.id))
			return nil
		}
		prev, next = append([]byte(nil), rec.chain...), next+1
		return nil
	})
	if err != nil {
		return out, unavailable("verify: read run_events", err)
	}
	endRun()
	cur = ""
	for _, id := range slices.Sorted(maps.Keys(lasts)) {
		if !seen[id] && lasts[id] > 0 {
			cur, broken = id, false
			report(CodeRecordMissing, 1, fmt.Sprintf("every record is missing: the run's last append was runSeq %d", lasts[id]))
			out.Runs++
		}
		seen[id] = true
	}
	for _, id := range runIDs {
		if !seen[id] {
			cur = id
			report(CodeRunNotFound, 0, "the log has no run "+id)
			seen[id] = true
		}
	}
	return out, nil
}
