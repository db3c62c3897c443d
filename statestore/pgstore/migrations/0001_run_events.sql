-- The run event log (Run Events Contract v2.0.1 on PostgreSQL).
-- runs holds each run's last runSeq: an append takes its row lock, so a
-- run's appends are serialized and its runSeq is 1, 2, 3, ... without
-- gaps; an append that writes nothing (a duplicate) rolls the increment
-- back and consumes no runSeq.
CREATE TABLE runs (
    run_id   text PRIMARY KEY,
    last_seq bigint NOT NULL
);

-- log_seq: the log's order across runs, for the consumers that follow the
-- whole log (the run list, the event bus: statestore.Follower). It is
-- taken from a sequence inside append_event after the run's lock, so it
-- grows with runSeq within a run. A sequence is not transactional: an
-- append that fails after taking a number leaves a hole, and one that has
-- not committed yet shows one for a moment; the follower waits for a hole
-- to fill and passes it once no statement can still fill it
-- (statement_timeout bounds every append, docs/postgres.md).
CREATE SEQUENCE run_events_log_seq;

CREATE TABLE run_events (
    run_id          text        NOT NULL,
    run_seq         bigint      NOT NULL,
    idempotency_key text        NOT NULL,
    event_id        text        NOT NULL,
    event_type      text        NOT NULL,
    -- the database's clock at the insert (persistedAt)
    persisted_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- the RunEventWrite as the producer sent it (compact JSON, kept byte
    -- for byte: jsonb would reorder a payload's keys)
    body            text        NOT NULL,
    log_seq         bigint      NOT NULL,
    PRIMARY KEY (run_id, run_seq),
    UNIQUE (run_id, idempotency_key)
);

CREATE UNIQUE INDEX run_events_by_log_seq ON run_events (log_seq);

-- Records are immutable: no UPDATE, DELETE or TRUNCATE, whoever asks.
CREATE FUNCTION run_events_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_events is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER run_events_no_update BEFORE UPDATE OR DELETE ON run_events
    FOR EACH ROW EXECUTE FUNCTION run_events_immutable();
CREATE TRIGGER run_events_no_truncate BEFORE TRUNCATE ON run_events
    FOR EACH STATEMENT EXECUTE FUNCTION run_events_immutable();
