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
