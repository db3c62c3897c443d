package registry

import (
	"encoding/base64"
	"fmt"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// keyEncoding encodes runIds into KV key tokens: base64url without padding
// uses only A-Z a-z 0-9 - _, all valid in keys, and never '.'. Strict
// decoding refuses non-canonical tokens, so ParseKey accepts exactly the keys
// that Key produces.
var keyEncoding = base64.RawURLEncoding.Strict()

// Key returns the KV key of (runID, idempotencyKey):
// base64url(runID, no padding) + "." + idempotencyKey. It returns an error
// wrapping ErrInvalidInput when runID is empty, longer than
// statestore.MaxIDBytes or not UTF-8, or idempotencyKey is not 64 lowercase
// hex digits.
func Key(runID, idempotencyKey string) (string, error) {
	if err := validateRunID(runID); err != nil {
		return "", err
	}
	if err := validateIdempotencyKey(idempotencyKey); err != nil {
		return "", err
	}
	return keyEncoding.EncodeToString([]byte(runID)) + "." + idempotencyKey, nil
}

func validateRunID(runID string) error {
	if err := statestore.CheckID(runID, false); err != nil {
		return fmt.Errorf("%w: runId %v", ErrInvalidInput, err)
	}
	return nil
}

func validateIdempotencyKey(k string) error {
	if len(k) != 64 {
		return fmt.Errorf("%w: idempotencyKey must be 64 lowercase hex digits, got %d bytes", ErrInvalidInput, len(k))
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%w: idempotencyKey must be 64 lowercase hex digits, got %q at %d", ErrInvalidInput, c, i)
		}
	}
	return nil
}

// isUUIDv4 reports whether s is a UUID v4 with the RFC 4122 variant in the
// canonical 36-character form (the form statestore.ValidateWrite accepts).
func isUUIDv4(s string) bool {
	if len(s) != 36 {
		return false
	}
	u, err := uuid.Parse(s)
	return err == nil && u.Version() == 4 && u.Variant() == uuid.RFC4122
}

func validateEventID(eventID string) error {
	if !isUUIDv4(eventID) {
		return fmt.Errorf("%w: eventId %q is not a UUID v4", ErrInvalidInput, eventID)
	}
	return nil
}
