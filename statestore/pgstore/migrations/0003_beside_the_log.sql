-- What a sidecar on PostgreSQL keeps beside the log (serve --store
-- postgres://...), so that one database holds every record a retry or a
-- restart depends on.

-- The producer EventIdRegistry (Run Events Contract §2.5.1): the eventId
-- of each (runId, idempotencyKey), registered before the first append and
-- replaced only by the append authority's (adopt). uuid: whatever writes
-- it, the value reads back as a canonical UUID.
CREATE TABLE event_ids (
    run_id          text NOT NULL,
    idempotency_key text NOT NULL,
    event_id        uuid NOT NULL,
    PRIMARY KEY (run_id, idempotency_key)
);

-- The control API's kept answers (Idempotency-Key): a claim (no answer
-- yet) or the first answer, with the request's fingerprint. Rows older
-- than the replies' TTL are treated as absent and deleted in passing.
CREATE TABLE control_replies (
    key         text        PRIMARY KEY,
    fingerprint text        NOT NULL,
    claimed_at  timestamptz NOT NULL,
    status      int,
    body        text,
    CHECK ((status IS NULL) = (body IS NULL))
);

CREATE INDEX control_replies_by_claimed_at ON control_replies (claimed_at);

-- Which NATS state serves with this database. With serve --store
-- postgres:// the run index, the run list's cursor, the event bus's
-- cursors, the admission queue and the artifacts stay on NATS; a sidecar
-- on this database with other NATS state (a lost data dir, the wrong
-- --nats-url) would not know the runs in flight. One row: the identity of
-- the NATS state paired at the first start.
CREATE TABLE nats_pairing (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    nats_state text        NOT NULL,
    paired_at  timestamptz NOT NULL DEFAULT now()
);

-- Run snapshots projected from the log, with the eventId at their
-- watermark (statestore.DurableSnapshot as JSON), so that a restarted
-- sidecar reduces only the records after it (seed 001 §1). Derived: a
-- lost or damaged row is rebuilt from the log.
CREATE TABLE run_snapshots (
    run_id   text        PRIMARY KEY,
    body     text        NOT NULL,
    saved_at timestamptz NOT NULL DEFAULT now()
);
