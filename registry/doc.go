// Package registry is the producer EventIdRegistry of the Run Events
// Contract v2.0.1 §2.5.1, kept in a NATS JetStream key-value bucket
// ([Open], the default) or in a PostgreSQL table beside the run event log
// ([OpenPostgres], serve --store postgres://...).
//
// The registry maps (runId, idempotencyKey) to a stable eventId (UUID v4).
// The protocol a producer follows, and that [Emitter] implements:
//
//  1. [Registry.EventID] returns the registered eventId, or generates a new
//     UUID v4 and writes it with an atomic KV Create BEFORE the append. When
//     producers race, exactly one Create wins and every producer reads the
//     winner's value, so they all send the same eventId.
//  2. The event is appended with that eventId. Retries of the same logical
//     event (same idempotencyKey) read the same eventId back.
//  3. If the append authority returns a different eventId (the registry entry
//     was lost, or the event was appended before the registry existed), the
//     store's metadata is authoritative: [Registry.Adopt] replaces the
//     registered eventId with the returned one (compare-and-set), and the
//     caller uses the returned metadata.
//
// # Key encoding
//
// KV keys may only contain -./0-9=A-Z_a-z, while runIds may contain '.',
// '*', '>', spaces and any Unicode. The key of (runId, idempotencyKey) is
//
//	base64url(runId, no padding) + "." + idempotencyKey
//
// for example runId "run.1" and key "9f86…0f00" give "cnVuLjE.9f86…0f00".
// base64url uses only A-Z a-z 0-9 - _, so the encoding is injective and
// reversible ([Key], [ParseKey]) and every key has exactly two subject
// tokens: one run's entries match the KV filter "<base64url(runId)>.>".
// The runId token is the same as natsstore.RunToken, so a run's registry
// keys and its event subjects can be matched by eye. runId must be
// 1..statestore.MaxIDBytes (256) bytes of valid UTF-8 and
// idempotencyKey exactly 64 lowercase hex digits, so a key is at most
// 342+1+64 = 407 bytes, far below the ~4 KiB at which NATS closes the
// connection. Invalid input is refused with [ErrInvalidInput] before
// anything is sent to the server. The value is the eventId as 36 ASCII
// characters.
//
// # Bucket and durability
//
// [Open] creates the bucket, or updates an existing one to the [Options]
// (so the options are authoritative): file storage, History 1,
// Options.Replicas replicas, and no TTL unless Options.TTL is set. With a TTL
// an entry expires TTL after its last write; a producer that retries an event
// later than that generates a new eventId, the append authority returns the
// original one and [Emitter] adopts it, which §2.5.1 permits. Choose a TTL
// longer than the longest run (including pauses) to keep that path rare.
//
// The bucket's stream is created by [Open] itself, as the KV API would
// create it, so that it can choose the persist mode, which the KV API
// cannot: a new single-replica bucket uses JetStream's async persist mode
// unless Options.SyncWrites is set. A write is then acknowledged from the
// server's memory and written to the file within milliseconds, without an
// fsync of its own; the run event stream keeps syncing every append. This
// halves the fsyncs of an event under "sync_interval: always" (BENCHMARKS.md).
//
// Entries survive producer restarts, and server restarts as far as the file
// store does: a crash of the server (with the embedded server, of the
// sidecar) can drop the last milliseconds of acknowledged writes, and a
// power loss those since the last sync. A lost entry degrades to the adopt
// path above, never to a duplicate event: the append authority refuses the
// duplicate (runId, idempotencyKey) and returns the stored eventId, which
// [Emitter] registers (TestEmitter_Emit_MemStore/LostRegistryEntry).
//
// # On PostgreSQL
//
// [OpenPostgres] keeps the entries in the table event_ids of the log's
// database (package pgstore's migrations create it): (run_id,
// idempotency_key) is its primary key, event_id a uuid. EventID is one
// statement (insert unless present, return the stored value), with a
// second read only when a racing producer's insert committed during it;
// Adopt is one upsert that writes only a different value. Entries are
// committed (fsynced by PostgreSQL) before EventID returns, and kept until
// an operator deletes them; the same Key validation refuses bad input
// before anything is sent (TestPostgres_*).
package registry
