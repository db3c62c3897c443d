package statestore

import "embed"

// Contract holds the machine-readable contract files shipped with the
// sidecar: the JSON Schemas of the envelope (RunEventWrite.schema.json,
// RunEventRecord.schema.json) and of each known event type
// (<EventType>.schema.json), and the idempotencyKey golden vectors
// RunEvents.v2.0.1.idempotency_vectors.json.
//
//go:embed contract/*.json
var Contract embed.FS
