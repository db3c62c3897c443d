package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestTransientStart: a start that failed because the NATS cluster is not
// ready yet is tried again; one that failed for a reason time does not
// fix fails at once.
func TestTransientStart(t *testing.T) {
	unavailable := func(err error) error {
		return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "read the log's watermark", Err: err}
	}
	apiErr := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("open bucket SIDECAR_RUNS: %w", &jetstream.APIError{Code: 503, ErrorCode: code, Description: "x"})
	}
	permission := fmt.Errorf("%w: Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.SIDECAR_EVENTS\"", nats.ErrPermissionViolation)
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"NoResponders", unavailable(nats.ErrNoResponders), true},
		{"Timeout", fmt.Errorf("open runs: %w", nats.ErrTimeout), true},
		{"RequestDeadline", unavailable(context.DeadlineExceeded), true},
		{"Reconnecting", unavailable(nats.ErrConnectionReconnecting), true},
		{"ClusterNotAvailable", apiErr(10008), true},
		{"NotLeader", apiErr(10009), true},
		{"NoPeersYet", apiErr(10005), true},
		{"MemberChange", apiErr(10202), true},
		{"JetStreamNotEnabled", fmt.Errorf("open: %w", jetstream.ErrJetStreamNotEnabled), false},
		{"StreamNotFound", fmt.Errorf("guard: %w", jetstream.ErrStreamNotFound), false},
		{"StreamConfigDiffers", apiErr(10058), false},
		{"Damaged", &statestore.Error{Code: statestore.CodeStoreDamaged, Message: "stream SIDECAR_EVENTS exists but deny_delete is off"}, false},
		{"DamagedAfterTimeout", fmt.Errorf("%w: %w", &statestore.Error{Code: statestore.CodeStoreDamaged, Message: "rolled back"}, nats.ErrTimeout), false},
		{"PermissionDenied", fmt.Errorf("%w (%w)", unavailable(context.DeadlineExceeded), permission), false},
		{"Authorization", fmt.Errorf("connect: %w", nats.ErrAuthorization), false},
		{"Canceled", unavailable(context.Canceled), false},
		{"Other", errors.New("listen on 127.0.0.1:8787: address already in use"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := transientStart(c.err); got != c.want {
				t.Errorf("transientStart(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

// TestConfig_NATSStartTimeout: the flag and its variable set the bound;
// a negative one is refused in one line.
func TestConfig_NATSStartTimeout(t *testing.T) {
	m := &Main{Stdout: io.Discard, Stderr: io.Discard}
	for _, c := range []struct {
		name string
		env  string
		args []string
		want time.Duration
		bad  bool
	}{
		{"Default", "", nil, 2 * time.Minute, false},
		{"Flag", "", []string{"--nats-start-timeout", "45s"}, 45 * time.Second, false},
		{"Env", "10m", nil, 10 * time.Minute, false},
		{"Off", "", []string{"--nats-start-timeout", "0"}, 0, false},
		{"Negative", "", []string{"--nats-start-timeout", "-1s"}, -time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("SIDECAR_NATS_START_TIMEOUT", c.env)
			}
			cfg := DefaultConfig()
			fs := m.newFlagSet("serve", "serve [flags]")
			cfg.registerFlags(fs)
			if err := parse(fs, c.args); err != nil {
				t.Fatal(err)
			}
			if cfg.NATSStartTimeout != c.want {
				t.Fatalf("NATSStartTimeout %s, want %s", cfg.NATSStartTimeout, c.want)
			}
			var ve *ConfigValidationError
			err := cfg.Validate()
			if got := errors.As(err, &ve) && strings.Contains(err.Error(), "--nats-start-timeout"); got != c.bad {
				t.Fatalf("Validate: %v, want a problem naming the flag: %v", err, c.bad)
			}
		})
	}
}
