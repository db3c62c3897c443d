-- append_event: an append in one statement (one round trip, one commit),
-- the same steps as before: the existing record answers a duplicate; the
-- run's counter row is created and locked; the key is looked up again (a
-- racing append may have committed while this one waited for the lock);
-- a conditional append (p_last >= 0) is refused unless the run's last
-- runSeq is p_last; the event is inserted at last + 1, with the next
-- log_seq. Each query of a
-- VOLATILE function sees what committed before it, as separate statements
-- would in READ COMMITTED.
CREATE FUNCTION append_event(p_run text, p_key text, p_event_id text, p_type text, p_body text, p_last bigint)
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
