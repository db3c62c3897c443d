package tracing

import (
	"fmt"
	"strings"
)

// The protocols of the OTLP exporter (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// DefaultServiceName is the service.name of the sidecar's spans unless
// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) names
// another.
const DefaultServiceName = "conductor-sidecar"

// Config says whether and how spans are exported. The zero Config is off.
type Config struct {
	// On exports spans over OTLP; off, every span is a no-op.
	On bool
	// Protocol is ProtocolHTTP or ProtocolGRPC.
	Protocol string
	// Endpoint is the collector's endpoint as the environment names it,
	// for the start's log line (the exporter reads it itself).
	Endpoint string
}

// ConfigFromEnv reads the standard OpenTelemetry environment (getenv is
// os.Getenv, or a test's map): tracing is on when
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is
// set, and off with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none.
// The protocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf. The exporter reads the
// rest itself (endpoint, headers, timeout, TLS, compression), and the SDK
// the sampler (OTEL_TRACES_SAMPLER) and the batch settings (OTEL_BSP_*).
// A value it cannot honour is ErrConfigInvalid.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return Config{}, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return Config{}, nil
	default:
		return Config{}, fmt.Errorf("%w: OTEL_TRACES_EXPORTER %q: the sidecar exports traces with otlp (or none)", ErrConfigInvalid, exp)
	}
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" {
		return Config{}, nil
	}
	name, proto := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		name, proto = "OTEL_EXPORTER_OTLP_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto = strings.TrimSpace(proto); proto {
	case "":
		proto = ProtocolHTTP
	case ProtocolHTTP, ProtocolGRPC:
	default:
		return Config{}, fmt.Errorf("%w: %s %q: use %s or %s", ErrConfigInvalid, name, proto, ProtocolHTTP, ProtocolGRPC)
	}
	return Config{On: true, Protocol: proto, Endpoint: endpoint}, nil
}
