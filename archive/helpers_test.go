package archive_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// withRawPayload sets w's payload to raw, byte for byte.
func withRawPayload(w *statestore.RunEventWrite, raw string) *statestore.RunEventWrite {
	w.Payload = json.RawMessage(raw)
	return w
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
