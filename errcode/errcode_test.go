package errcode_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// testError is a package's coded error type, as each errors.go writes it.
type testError struct {
	Code string
	Err  error
}

func (e *testError) Error() string           { return e.Code }
func (e *testError) Unwrap() error           { return e.Err }
func (e *testError) ErrorCode() string       { return e.Code }
func (e *testError) ErrorKind() errcode.Kind { return kinds[e.Code] }
func (e *testError) Is(target error) bool    { return errcode.Match(e, target) }

var kinds = map[string]errcode.Kind{"GONE": errcode.NotFound, "BUSY": errcode.Unavailable}

var (
	errGone = &testError{Code: "GONE"}
	errBusy = &testError{Code: "BUSY"}
	errDown = errcode.New(errcode.Unavailable, "STORE_UNAVAILABLE", "store: unavailable")
	errAlso = errcode.New(errcode.Unavailable, "STORE_UNAVAILABLE", "other: unavailable")
)

func TestMatch(t *testing.T) {
	gone := fmt.Errorf("get run: %w", &testError{Code: "GONE"})
	down := fmt.Errorf("%w: read key: %w", errDown, errors.New("timeout"))
	for _, tc := range []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"SameCode", gone, errGone, true},
		{"OtherCode", gone, errBusy, false},
		{"Kind", gone, errcode.NotFound, true},
		{"OtherKind", gone, errcode.Conflict, false},
		{"SentinelIdentity", down, errDown, true},
		{"SentinelSameCodeOtherValue", down, errAlso, false},
		{"SentinelKind", down, errcode.Unavailable, true},
		{"SentinelOtherKind", down, errcode.NotFound, false},
		{"Uncoded", errors.New("x"), errcode.Internal, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errors.Is(tc.err, tc.target); got != tc.want {
				t.Errorf("errors.Is(%v, %v): got %v want %v", tc.err, tc.target, got, tc.want)
			}
		})
	}
}

func TestOf(t *testing.T) {
	outer := &testError{Code: "BUSY", Err: &testError{Code: "GONE"}}
	for _, tc := range []struct {
		name string
		err  error
		code string
		kind errcode.Kind
	}{
		{"Nil", nil, "", errcode.Internal},
		{"Uncoded", errors.New("x"), "", errcode.Internal},
		{"Wrapped", fmt.Errorf("ctx: %w", errGone), "GONE", errcode.NotFound},
		{"OutermostWins", outer, "BUSY", errcode.Unavailable},
		{"Sentinel", fmt.Errorf("%w: cause", errDown), "STORE_UNAVAILABLE", errcode.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errcode.CodeOf(tc.err); got != tc.code {
				t.Errorf("CodeOf: got %q want %q", got, tc.code)
			}
			got := errcode.Internal // the kind of an error with no code
			if c, ok := errcode.Of(tc.err); ok {
				got = c.ErrorKind()
			}
			if got != tc.kind {
				t.Errorf("kind: got %v want %v", got, tc.kind)
			}
		})
	}
}

func TestKind_String(t *testing.T) {
	if got := errcode.NotFound.String(); got != "NotFound" {
		t.Errorf("got %q want NotFound", got)
	}
	if got := errcode.Kind(42).String(); got != "Kind(42)" {
		t.Errorf("got %q want Kind(42)", got)
	}
}

// A kind kept in JSON is its name, and reads back as itself; a name that
// is no kind's is an error.
func TestKind_Text(t *testing.T) {
	for k := errcode.Internal; k <= errcode.Unavailable; k++ {
		b, err := json.Marshal(k)
		if err != nil || string(b) != `"`+k.String()+`"` {
			t.Fatalf("marshal %v: %s %v", k, b, err)
		}
		var back errcode.Kind
		if err := json.Unmarshal(b, &back); err != nil || back != k {
			t.Fatalf("unmarshal %s: %v %v", b, back, err)
		}
	}
	var k errcode.Kind
	if err := json.Unmarshal([]byte(`"Sideways"`), &k); err == nil {
		t.Fatal("an unknown kind's name decoded")
	}
}
