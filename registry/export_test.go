package registry

import (
	"fmt"
	"strings"
)

// ParseKey reverses Key. It returns an error wrapping ErrInvalidInput for a
// key that Key cannot produce.
func ParseKey(key string) (runID, idempotencyKey string, err error) {
	token, idempotencyKey, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", fmt.Errorf("%w: key %q has no '.'", ErrInvalidInput, key)
	}
	raw, err := keyEncoding.DecodeString(token)
	if err != nil {
		return "", "", fmt.Errorf("%w: key %q: runId token: %v", ErrInvalidInput, key, err)
	}
	runID = string(raw)
	if _, err := Key(runID, idempotencyKey); err != nil {
		return "", "", err
	}
	return runID, idempotencyKey, nil
}
