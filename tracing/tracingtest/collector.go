// Package tracingtest runs a real OpenTelemetry Collector for tests (the
// one deploy/local/otelcol.sh builds: OTLP receiver, file exporter) and
// reads back the spans it received.
package tracingtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/proctest"
)

// EnvBinary names the collector binary the tests run.
const EnvBinary = "SIDECAR_TEST_OTELCOL"

// Collector is a running collector.
type Collector struct {
	// GRPC and HTTP are the OTLP endpoints (http://127.0.0.1:port).
	GRPC, HTTP string
	file       string
	proc       *proctest.Process
}

// Start starts the collector of $SIDECAR_TEST_OTELCOL on free loopback
// ports and stops it when the test ends. Without the variable the test is
// skipped, or fails under CI=true.
func Start(t testing.TB) *Collector {
	t.Helper()
	bin := os.Getenv(EnvBinary)
	if bin == "" {
		msg := EnvBinary + " is not set: build the test collector with deploy/local/otelcol.sh and set " + EnvBinary + "=<dir>/otelcol"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	c := &Collector{GRPC: "http://" + proctest.FreeAddr(t), HTTP: "http://" + proctest.FreeAddr(t), file: filepath.Join(dir, "spans.jsonl")}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  file:
    path: %s
    flush_interval: 50ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
`, c.GRPC[len("http://"):], c.HTTP[len("http://"):], c.file)
	cfgPath := filepath.Join(dir, "otelcol.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.proc = proctest.Start(t, exec.Command(bin, "--config", cfgPath), proctest.Options{Log: filepath.Join(dir, "otelcol.log")},
		c.GRPC[len("http://"):], c.HTTP[len("http://"):])
	return c
}

// Span is a span as the collector received it.
type Span struct {
	TraceID, SpanID, ParentSpanID, Name string
	Kind                                int
	Start, End                          time.Time
	Attributes                          map[string]any
	Links                               []Link
	StatusCode                          int // 2: error
	Service                             string
	Events                              []string
}

// Link is a span's link.
type Link struct{ TraceID, SpanID string }

// Spans returns every span the collector wrote so far.
func (c *Collector) Spans(t testing.TB) []Span {
	t.Helper()
	f, err := os.Open(c.file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Span
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var doc otlpJSON
		if err := json.Unmarshal(sc.Bytes(), &doc); err != nil {
			continue // a line still being written
		}
		for _, rs := range doc.ResourceSpans {
			service, _ := attrs(rs.Resource.Attributes)["service.name"].(string)
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					sp := Span{TraceID: s.TraceID, SpanID: s.SpanID, ParentSpanID: s.ParentSpanID, Name: s.Name, Kind: s.Kind,
						Start: nanos(s.StartTimeUnixNano), End: nanos(s.EndTimeUnixNano), Attributes: attrs(s.Attributes),
						StatusCode: s.Status.Code, Service: service}
					for _, l := range s.Links {
						sp.Links = append(sp.Links, Link{TraceID: l.TraceID, SpanID: l.SpanID})
					}
					for _, e := range s.Events {
						sp.Events = append(sp.Events, e.Name)
					}
					out = append(out, sp)
				}
			}
		}
	}
	return out
}

// WaitSpans waits up to timeout for spans that ok accepts, and returns
// the last ones read.
func (c *Collector) WaitSpans(t testing.TB, timeout time.Duration, ok func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := c.Spans(t)
		if ok(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			for _, s := range spans {
				t.Logf("span %s trace=%s id=%s parent=%s attrs=%v", s.Name, s.TraceID, s.SpanID, s.ParentSpanID, s.Attributes)
			}
			t.Fatalf("the collector did not receive the spans within %s (%d spans)", timeout, len(spans))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type otlpJSON struct {
	ResourceSpans []struct {
		Resource struct {
			Attributes []kv `json:"attributes"`
		} `json:"resource"`
		ScopeSpans []struct {
			Spans []struct {
				TraceID           string `json:"traceId"`
				SpanID            string `json:"spanId"`
				ParentSpanID      string `json:"parentSpanId"`
				Name              string `json:"name"`
				Kind              int    `json:"kind"`
				StartTimeUnixNano string `json:"startTimeUnixNano"`
				EndTimeUnixNano   string `json:"endTimeUnixNano"`
				Attributes        []kv   `json:"attributes"`
				Links             []struct {
					TraceID string `json:"traceId"`
					SpanID  string `json:"spanId"`
				} `json:"links"`
				Events []struct {
					Name string `json:"name"`
				} `json:"events"`
				Status struct {
					Code int `json:"code"`
				} `json:"status"`
			} `json:"spans"`
		} `json:"scopeSpans"`
	} `json:"resourceSpans"`
}

type kv struct {
	Key   string `json:"key"`
	Value struct {
		StringValue *string  `json:"stringValue"`
		IntValue    *string  `json:"intValue"`
		BoolValue   *bool    `json:"boolValue"`
		DoubleValue *float64 `json:"doubleValue"`
	} `json:"value"`
}

func attrs(kvs []kv) map[string]any {
	m := map[string]any{}
	for _, a := range kvs {
		switch v := a.Value; {
		case v.StringValue != nil:
			m[a.Key] = *v.StringValue
		case v.IntValue != nil:
			n, _ := strconv.ParseInt(*v.IntValue, 10, 64)
			m[a.Key] = n
		case v.BoolValue != nil:
			m[a.Key] = *v.BoolValue
		case v.DoubleValue != nil:
			m[a.Key] = *v.DoubleValue
		}
	}
	return m
}

func nanos(s string) time.Time {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(0, n).UTC()
}

// CPU is the CPU time (user and system) the collector process has used
// so far, from /proc (Linux; clock ticks of 10 ms).
func (c *Collector) CPU(t testing.TB) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.proc.Cmd.Process.Pid))
	if err != nil {
		t.Fatalf("read the collector's CPU: %v", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing one. utime and stime are fields 14
	// and 15.
	rest := b[bytes.LastIndexByte(b, ')')+2:]
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		t.Fatalf("read the collector's CPU: %q", b)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("read the collector's CPU: %q: %v", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
