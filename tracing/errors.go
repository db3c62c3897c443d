package tracing

import "github.com/conductor-sidecar/sidecar/errcode"

// Machine codes of the tracing package.
const (
	// CodeConfigInvalid: the OTEL_* environment asks for something the
	// sidecar cannot export (an unknown protocol or exporter).
	CodeConfigInvalid = "TRACING_CONFIG_INVALID"
)

// ErrConfigInvalid matches every TRACING_CONFIG_INVALID error
// (errcode.Invalid): serve refuses to start, nothing is exported.
var ErrConfigInvalid = errcode.New(errcode.Invalid, CodeConfigInvalid, "tracing configuration invalid")
