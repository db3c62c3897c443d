package pgstore

import (
	"errors"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Machine-readable codes of this package, beside statestore's
// (STORE_UNAVAILABLE, STORE_DAMAGED). Errors carry them as
// *statestore.Error; match them with errors.Is and the sentinels below.
// Their kind is errcode.Internal: an operator must act (migrate, grant a
// role, repair the log).
const (
	// CodeRoleRefused: the connection's role is not the one the call
	// needs: serve connected as a role that can alter the log while the
	// database has a runtime role, migrate connected as a role that does
	// not own the log, or --runtime-role names a role that could alter it.
	CodeRoleRefused = "STORE_ROLE_REFUSED"
	// CodeMigrationNeeded: the database's schema is older than this
	// binary's and the connection's role may not migrate it: run sidecar
	// migrate as the owner.
	CodeMigrationNeeded = "STORE_MIGRATION_NEEDED"
	// CodeSchemaNewer: the database's schema is newer than this binary's
	// (a sidecar of a later version migrated it): this one must not write
	// to, migrate or vouch for a log whose format it does not know. Run a
	// sidecar of that version or newer.
	CodeSchemaNewer = "STORE_SCHEMA_NEWER"
	// CodeRecordMissing (sidecar verify): a run lacks a record between
	// runSeq 1 and its last runSeq.
	CodeRecordMissing = "LOG_RECORD_MISSING"
	// CodeChainBroken (sidecar verify, and a snapshot's load): a record is
	// not the one its chain hash was computed over (changed, or its
	// predecessor changed or removed), or the chain hash at a saved
	// snapshot's watermark is not the one the snapshot was saved with.
	CodeChainBroken = "LOG_CHAIN_BROKEN"
	// CodeRunNotFound (sidecar verify RUN...): the log has no such run.
	CodeRunNotFound = "RUN_NOT_FOUND"
	// CodeRunNotFinished (Remover.RemoveRun): the run has no terminal
	// event, so it may not leave the log; nothing was removed.
	CodeRunNotFinished = "RUN_NOT_FINISHED"
	// CodeURLInvalid: the PostgreSQL URL cannot be parsed (a malformed
	// host or port, an unknown sslmode, a bad pool_max_conns); the message
	// says what, with any password in the URL masked. Its kind is
	// errcode.Invalid: a configuration error, found before connecting.
	CodeURLInvalid = "STORE_URL_INVALID"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrOtherNATSState is the cause of Pair's STORE_DAMAGED refusal of a
	// database paired with other NATS state (errors.Is), which no other
	// STORE_DAMAGED has: its fix is the data dir it was used with.
	ErrOtherNATSState = errors.New("pgstore: the database is paired with other NATS state")
	// ErrRoleRefused matches every STORE_ROLE_REFUSED error.
	ErrRoleRefused = &statestore.Error{Code: CodeRoleRefused}
	// ErrMigrationNeeded matches every STORE_MIGRATION_NEEDED error.
	ErrMigrationNeeded = &statestore.Error{Code: CodeMigrationNeeded}
	// ErrSchemaNewer matches every STORE_SCHEMA_NEWER error.
	ErrSchemaNewer = &statestore.Error{Code: CodeSchemaNewer}
	// ErrChainBroken matches every LOG_CHAIN_BROKEN error.
	ErrChainBroken = &statestore.Error{Code: CodeChainBroken}
	// ErrRunNotFinished matches every RUN_NOT_FINISHED error.
	ErrRunNotFinished = &statestore.Error{Code: CodeRunNotFinished}
	// ErrURLInvalid matches every STORE_URL_INVALID error.
	ErrURLInvalid = &statestore.Error{Code: CodeURLInvalid, Kind: errcode.Invalid}
)
