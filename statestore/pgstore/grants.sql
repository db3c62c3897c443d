-- What `sidecar serve` needs, granted to the runtime role by `sidecar
-- migrate` after every migration (:"runtime" is the role): it reads the
-- log and appends through append_event alone; it cannot insert, update,
-- delete or truncate records, nor alter the tables or their triggers.
GRANT SELECT ON schema_migrations, runtime_role, runs, run_events TO :"runtime";
GRANT EXECUTE ON FUNCTION append_event(text, text, text, text, text, bigint) TO :"runtime";
-- Reading the log_seq sequence's last value (sidecar_log_last_sequence);
-- SELECT does not let it take a number.
GRANT SELECT ON SEQUENCE run_events_log_seq TO :"runtime";
GRANT SELECT, INSERT, UPDATE ON event_ids, nats_pairing TO :"runtime";
GRANT SELECT, INSERT, UPDATE, DELETE ON control_replies, run_snapshots TO :"runtime";
