-- A hash chain over each run's records, and the runtime role.
--
-- Each record's chain_hash is SHA-256(the chain_hash of the run's previous
-- record || this record's canonical bytes); the first record of a run
-- chains from 32 zero bytes. The canonical bytes (docs/postgres.md,
-- "Tamper evidence") are run_seq, log_seq (8-byte big-endian each),
-- persisted_at (PostgreSQL's binary timestamptz: 8-byte big-endian
-- microseconds since 2000-01-01 UTC), then run_id, idempotency_key,
-- event_id, event_type and body, each as a 4-byte big-endian length and
-- its UTF-8 bytes. `sidecar verify` recomputes the same in Go.

-- Both are plain SQL expressions, STABLE as convert_to is.
CREATE FUNCTION run_event_field(p text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT int4send(octet_length(convert_to(p, 'UTF8'))) || convert_to(p, 'UTF8')
$$;

CREATE FUNCTION run_event_chain(p_prev bytea, p_run text, p_seq bigint, p_log bigint, p_at timestamptz,
    p_key text, p_id text, p_type text, p_body text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT sha256(p_prev || int8send(p_seq) || int8send(p_log) || timestamptz_send(p_at)
        || run_event_field(p_run) || run_event_field(p_key) || run_event_field(p_id)
        || run_event_field(p_type) || run_event_field(p_body))
$$;

-- The records already in the log are chained in runSeq order, as they are.
ALTER TABLE run_events ADD COLUMN chain_hash bytea;
ALTER TABLE run_events DISABLE TRIGGER run_events_no_update;
DO $$
DECLARE
    r      record;
    v_run  text;
    v_prev bytea;
BEGIN
    FOR r IN SELECT e.run_id, e.run_seq, e.log_seq, e.persisted_at, e.idempotency_key, e.event_id, e.event_type, e.body
             FROM run_events e ORDER BY e.run_id, e.run_seq LOOP
        IF v_run IS DISTINCT FROM r.run_id THEN
            v_run := r.run_id;
            v_prev := decode(repeat('00', 32), 'hex');
        END IF;
        v_prev := run_event_chain(v_prev, r.run_id, r.run_seq, r.log_seq, r.persisted_at,
            r.idempotency_key, r.event_id, r.event_type, r.body);
        UPDATE run_events SET chain_hash = v_prev WHERE run_id = r.run_id AND run_seq = r.run_seq;
    END LOOP;
END;
$$;
ALTER TABLE run_events ENABLE TRIGGER run_events_no_update;
ALTER TABLE run_events ALTER COLUMN chain_hash SET NOT NULL;

-- append_event as before, now chaining: the run's previous record must be
-- there (a log whose last record was removed refuses the append:
-- data_corrupted). SECURITY DEFINER: it runs with its owner's rights, so
-- the runtime role appends through it alone, without INSERT on the
-- tables; its search_path is pinned to this schema.
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
REVOKE ALL ON FUNCTION append_event(text, text, text, text, text, bigint) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION append_event(text, text, text, text, text, bigint) SET search_path = %I, pg_temp', current_schema());
END;
$$;

-- A saved snapshot keeps the chain hash of the record at its watermark;
-- the snapshots saved before the chain existed are dropped (derived: each
-- run is projected from the log once and saved anew).
DELETE FROM run_snapshots;
ALTER TABLE run_snapshots ADD COLUMN chain_hash bytea NOT NULL;

-- The role `sidecar serve` connects as (sidecar migrate --runtime-role):
-- once one is recorded, serve refuses to connect as a role that can alter
-- the log, and every later migration grants it what it needs.
CREATE TABLE runtime_role (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    role_name name    NOT NULL
);
