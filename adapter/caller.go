package adapter

import "context"

// callerKey is the context key of WithCaller.
type callerKey struct{}

// WithCaller returns ctx naming who a call to Conductor is made for (an
// API principal): while control calls wait for a place at Conductor, the
// places go to the callers in turn, so that one caller's flood of requests
// does not hold up another's. Calls without a caller (the sidecar's own
// background work, an API without authentication) are one caller.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// CallerOf returns the caller WithCaller named in ctx ("" for none).
func CallerOf(ctx context.Context) string {
	c, _ := ctx.Value(callerKey{}).(string)
	return c
}
