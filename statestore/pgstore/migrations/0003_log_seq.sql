-- log_seq: the log's order across runs, for the consumers that follow the
-- whole log (the run list, the event bus: statestore.Follower). It is
-- taken from a sequence inside append_event after the run's lock, so it
-- grows with runSeq within a run. A sequence is not transactional: an
-- append that fails after taking a number leaves a hole, and one that has
-- not committed yet shows one for a moment; the follower waits for a hole
-- to fill and passes it once no statement can still fill it
-- (statement_timeout bounds every append, docs/postgres.md).
CREATE SEQUENCE run_events_log_seq;

ALTER TABLE run_events ADD COLUMN log_seq bigint;

-- Existing records get numbers in their persisted order (each run's in
-- runSeq order), the triggers off for this one statement.
ALTER TABLE run_events DISABLE TRIGGER run_events_no_update;
UPDATE run_events e SET log_seq = o.n
    FROM (SELECT run_id, run_seq, row_number() OVER (ORDER BY persisted_at, run_id, run_seq) AS n FROM run_events) o
    WHERE e.run_id = o.run_id AND e.run_seq = o.run_seq;
ALTER TABLE run_events ENABLE TRIGGER run_events_no_update;
SELECT setval('run_events_log_seq', coalesce((SELECT max(log_seq) FROM run_events), 0) + 1, false);

ALTER TABLE run_events ALTER COLUMN log_seq SET NOT NULL;
CREATE UNIQUE INDEX run_events_by_log_seq ON run_events (log_seq);

CREATE OR REPLACE FUNCTION append_event(p_run text, p_key text, p_event_id text, p_type text, p_body text, p_last bigint)
RETURNS TABLE (o_event_id text, o_run_seq bigint, o_persisted_at timestamptz, o_idempotent boolean, o_changed_last bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_last bigint;
BEGIN
    SELECT e.event_id, e.run_seq, e.persisted_at INTO o_event_id, o_run_seq, o_persisted_at
        FROM run_events e WHERE e.run_id = p_run AND e.idempotency_key = p_key;
    IF FOUND THEN
        o_idempotent := true;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO runs (run_id, last_seq) VALUES (p_run, 0) ON CONFLICT (run_id) DO NOTHING;
    SELECT r.last_seq INTO v_last FROM runs r WHERE r.run_id = p_run FOR UPDATE;
    SELECT e.event_id, e.run_seq, e.persisted_at INTO o_event_id, o_run_seq, o_persisted_at
        FROM run_events e WHERE e.run_id = p_run AND e.idempotency_key = p_key;
    IF FOUND THEN
        o_idempotent := true;
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_last >= 0 AND v_last <> p_last THEN
        o_changed_last := v_last;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO run_events (run_id, run_seq, idempotency_key, event_id, event_type, body, log_seq)
        VALUES (p_run, v_last + 1, p_key, p_event_id, p_type, p_body, nextval('run_events_log_seq'))
        RETURNING run_events.persisted_at INTO o_persisted_at;
    UPDATE runs SET last_seq = v_last + 1 WHERE runs.run_id = p_run;
    o_event_id := p_event_id;
    o_run_seq := v_last + 1;
    o_idempotent := false;
    RETURN NEXT;
END;
$$;
