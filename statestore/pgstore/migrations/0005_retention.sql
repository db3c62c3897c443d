-- Retention on PostgreSQL: a finished run leaves the log through
-- remove_run alone, which only the retention role may execute
-- (sidecar migrate --retention-role, retention_grants.sql). The triggers
-- keep refusing every other UPDATE, DELETE and TRUNCATE of a record, the
-- owner's and the runtime role's included.

-- The role retention connects as (serve --retention-store): recorded, so
-- that every later migration grants it EXECUTE on remove_run again.
CREATE TABLE retention_role (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    role_name name    NOT NULL
);

-- A DELETE passes the trigger only inside remove_run, for the run it
-- removes: remove_run sets sidecar.removing_run for its own transaction.
-- Setting it by hand lets no one else delete: the runtime and retention
-- roles hold no DELETE on run_events (refused before any trigger), and the
-- owner, who could set it, could disable the triggers anyway
-- (docs/postgres.md, "Roles").
CREATE OR REPLACE FUNCTION run_events_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF current_setting('sidecar.removing_run', true) = OLD.run_id THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'run_events is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$;

-- remove_run removes a finished run from hot state in one transaction:
-- its records, its counter row, its saved snapshot and its event ids. It
-- removes nothing unless the run's last runSeq is p_last and it has
-- p_records records (what its archive holds) and one of them is terminal
-- (RunCompleted, RunFailed, RunCancelled); it answers what it found. A run
-- the log does not have (removed before) answers o_removed 0 and
-- o_last 0. The run's counter row is locked first, so an append to the run
-- waits for the removal and then finds the run gone.
CREATE FUNCTION remove_run(p_run text, p_last bigint, p_records bigint)
RETURNS TABLE (o_removed bigint, o_last bigint, o_records bigint, o_finished boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
BEGIN
    o_removed := 0;
    SELECT r.last_seq INTO o_last FROM runs r WHERE r.run_id = p_run FOR UPDATE;
    IF NOT FOUND THEN
        o_last := 0;
        o_records := 0;
        o_finished := false;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT count(*), coalesce(bool_or(e.event_type IN ('RunCompleted', 'RunFailed', 'RunCancelled')), false)
        INTO o_records, o_finished FROM run_events e WHERE e.run_id = p_run;
    IF o_last <> p_last OR o_records <> p_records OR NOT o_finished THEN
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM set_config('sidecar.removing_run', p_run, true);
    DELETE FROM run_events e WHERE e.run_id = p_run;
    GET DIAGNOSTICS o_removed = ROW_COUNT;
    PERFORM set_config('sidecar.removing_run', '', true);
    DELETE FROM runs r WHERE r.run_id = p_run;
    DELETE FROM run_snapshots s WHERE s.run_id = p_run;
    DELETE FROM event_ids i WHERE i.run_id = p_run;
    RETURN NEXT;
END;
$$;
REVOKE ALL ON FUNCTION remove_run(text, bigint, bigint) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION remove_run(text, bigint, bigint) SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- append_event as in 0004, but an append that waited for the run's row
-- while remove_run removed the run creates the row again (the run starts
-- anew at runSeq 1) instead of finding no row and failing.
CREATE OR REPLACE FUNCTION append_event(p_run text, p_key text, p_event_id text, p_type text, p_body text, p_last bigint)
RETURNS TABLE (o_event_id text, o_run_seq bigint, o_persisted_at timestamptz, o_idempotent boolean, o_changed_last bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_last bigint;
    v_prev bytea;
    v_log  bigint;
    v_at   timestamptz;
BEGIN
    SELECT e.event_id, e.run_seq, e.persisted_at INTO o_event_id, o_run_seq, o_persisted_at
        FROM run_events e WHERE e.run_id = p_run AND e.idempotency_key = p_key;
    IF FOUND THEN
        o_idempotent := true;
        RETURN NEXT;
        RETURN;
    END IF;
    LOOP
        INSERT INTO runs (run_id, last_seq) VALUES (p_run, 0) ON CONFLICT (run_id) DO NOTHING;
        SELECT r.last_seq INTO v_last FROM runs r WHERE r.run_id = p_run FOR UPDATE;
        EXIT WHEN FOUND;
        -- remove_run removed the run while this append waited for its row:
        -- the run starts anew, as it would for an append after the removal.
    END LOOP;
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
    IF v_last = 0 THEN
        v_prev := decode(repeat('00', 32), 'hex');
    ELSE
        SELECT e.chain_hash INTO v_prev FROM run_events e WHERE e.run_id = p_run AND e.run_seq = v_last;
        IF v_prev IS NULL THEN
            RAISE EXCEPTION 'run % has no record at runSeq %, its last: the log was changed outside the sidecar (run sidecar verify)', p_run, v_last
                USING ERRCODE = 'data_corrupted';
        END IF;
    END IF;
    v_log := nextval('run_events_log_seq');
    v_at := clock_timestamp();
    INSERT INTO run_events (run_id, run_seq, idempotency_key, event_id, event_type, persisted_at, body, log_seq, chain_hash)
        VALUES (p_run, v_last + 1, p_key, p_event_id, p_type, v_at, p_body, v_log,
            run_event_chain(v_prev, p_run, v_last + 1, v_log, v_at, p_key, p_event_id, p_type, p_body));
    UPDATE runs SET last_seq = v_last + 1 WHERE runs.run_id = p_run;
    o_event_id := p_event_id;
    o_run_seq := v_last + 1;
    o_persisted_at := v_at;
    o_idempotent := false;
    RETURN NEXT;
END;
$$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION append_event(text, text, text, text, text, bigint) SET search_path = %I, pg_temp', current_schema());
END;
$$;
