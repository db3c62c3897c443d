package pgstore

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// SizeCollector exports the log's size at each scrape
// (statestore.NewLogSizeCollector), read in one query as the runtime
// role: the bytes of run_events with its indexes and TOAST
// (pg_total_relation_size), its records as the table statistics' live
// rows (which follow inserts and deletes within seconds of their commit:
// not a count(*), so that a scrape costs the same at any size), and the
// last log_seq taken: the log_seq sequence's last value, which removals
// do not take back. Register it with the node's registry.
func (s *Store) SizeCollector() prometheus.Collector {
	return statestore.NewLogSizeCollector(s.logSize)
}

// sizeQuery reads the three in one round trip. The sequence's last value
// is read from pg_sequences, which shows it to a role with SELECT on the
// sequence (granted by migrate) and NULL to one without (a database not
// migrated again since): then max(log_seq), one step down the
// run_events_by_log_seq index, which goes back when the newest runs are
// removed.
const sizeQuery = `SELECT pg_total_relation_size('run_events'::regclass),
	coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'run_events'::regclass), 0),
	greatest(coalesce((SELECT last_value FROM pg_sequences WHERE schemaname = current_schema() AND sequencename = 'run_events_log_seq'), 0),
		coalesce((SELECT max(log_seq) FROM run_events), 0))`

func (s *Store) logSize(ctx context.Context) (statestore.LogSize, error) {
	var z statestore.LogSize
	err := s.pool.QueryRow(ctx, sizeQuery).Scan(&z.Bytes, &z.Records, &z.LastSequence)
	return z, err
}
