// Package secrets resolves a step's secret references right before it runs
// and redacts the resolved values from everything the step produces.
//
// A plan names secrets only by reference (plan.SecretRef); the worker
// resolves them with a Resolver, hands the values to the executor, and the
// executor passes every byte it keeps (captured output, response bodies,
// error messages) through a Redactor built from those values. Errors of
// this package never contain a secret value: they name the secret and its
// reference (a locator such as "env:API_TOKEN" or "file:/run/secrets/db").
package secrets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Machine codes of resolution errors. They are part of the contract: the
// worker records them in StepFailed and operators alert on them.
const (
	// CodeNotFound: the environment variable is unset, or the file does
	// not exist.
	CodeNotFound = "SECRET_NOT_FOUND"
	// CodeUnreadable: the file exists but cannot be read (permission, a
	// directory or other non-regular file, an I/O error).
	CodeUnreadable = "SECRET_UNREADABLE"
	// CodeTooLarge: the file is larger than Resolver.MaxFileBytes.
	CodeTooLarge = "SECRET_TOO_LARGE"
	// CodeInvalidRef: the reference is malformed (unknown provider, empty
	// or duplicate name, ...).
	CodeInvalidRef = "SECRET_REF_INVALID"
)

// Providers, the prefixes of SecretRef.Ref.
const (
	// ProviderEnv reads the worker's environment: "env:VAR".
	ProviderEnv = "env"
	// ProviderFile reads a file: "file:/path". One trailing newline ("\n"
	// or "\r\n") is removed. A relative path is relative to the worker's
	// working directory.
	ProviderFile = "file"
)

// DefaultMaxFileBytes is the default size limit of a file: secret.
const DefaultMaxFileBytes = 64 << 10

// maxNameLen bounds SecretRef.Name.
const maxNameLen = 256

// Error is a secret resolution error. It never contains the secret's
// value. errors.As(err, **statestore.Error) also succeeds on it (with the
// same Code and message), so statestore.CodeOf(err) returns Code.
type Error struct {
	// Code is one of the Code* constants.
	Code string
	// Name is the SecretRef.Name, Ref its locator.
	Name, Ref string
	// Reason is a short human explanation.
	Reason string
	// Retryable says whether resolving again may succeed (a transient I/O
	// error); missing, malformed, forbidden and oversized secrets are not.
	Retryable bool
	// Err is the cause (an *fs.PathError and the like), if any.
	Err error
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: secret %q (%s): %s", e.Code, e.Name, e.Ref, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches any *Error with the same Code, so errors.Is(err, ErrNotFound)
// works on every instance.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Code == e.Code && t.Name == "" && t.Ref == ""
}

// As lets errors.As(err, &statestoreErr) see a *statestore.Error with this
// error's Code, so code that only knows the statestore contract
// (statestore.CodeOf) still gets the machine code.
func (e *Error) As(target any) bool {
	if t, ok := target.(**statestore.Error); ok {
		*t = &statestore.Error{Code: e.Code, Message: e.Error(), Err: e.Err}
		return true
	}
	return false
}

// StepError returns the error as a step's recorded error.
func (e *Error) StepError() *statestore.StepError {
	return &statestore.StepError{Code: e.Code, Message: e.Error(), Retryable: e.Retryable}
}

// Sentinel errors, matched with errors.Is.
var (
	// ErrNotFound matches every SECRET_NOT_FOUND error.
	ErrNotFound = &Error{Code: CodeNotFound}
	// ErrUnreadable matches every SECRET_UNREADABLE error.
	ErrUnreadable = &Error{Code: CodeUnreadable}
	// ErrTooLarge matches every SECRET_TOO_LARGE error.
	ErrTooLarge = &Error{Code: CodeTooLarge}
	// ErrInvalidRef matches every SECRET_REF_INVALID error.
	ErrInvalidRef = &Error{Code: CodeInvalidRef}
)

// Resolver resolves secret references with the env: and file: providers.
// The zero value is ready to use; exported fields may be set before first
// use. A Resolver is safe for concurrent use.
type Resolver struct {
	// LookupEnv reads the environment (default os.LookupEnv).
	LookupEnv func(key string) (string, bool)
	// MaxFileBytes bounds a file: secret (default DefaultMaxFileBytes).
	MaxFileBytes int64
	// Logger receives warnings (names and references only, never values).
	// Default nop.
	Logger *zap.Logger
}

// Resolve returns the values of refs by SecretRef.Name. It stops at the
// first reference that cannot be resolved and returns an *Error for it;
// no value is returned then. Resolution honours ctx between references.
// A value shorter than MinRedactLen is returned but cannot be redacted:
// Resolve logs a warning naming the secret.
func (r *Resolver) Resolve(ctx context.Context, refs []plan.SecretRef) (map[string]string, error) {
	out := make(map[string]string, len(refs))
	for _, ref := range refs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("resolve secrets: %w", err)
		}
		if err := checkName(ref.Name); err != nil {
			return nil, &Error{Code: CodeInvalidRef, Name: ref.Name, Ref: ref.Ref, Reason: err.Error()}
		}
		if _, dup := out[ref.Name]; dup {
			return nil, &Error{Code: CodeInvalidRef, Name: ref.Name, Ref: ref.Ref, Reason: "name is used twice"}
		}
		v, err := r.resolve(ref)
		if err != nil {
			return nil, err
		}
		if len(v) > 0 && len(v) < MinRedactLen {
			r.logger().Warn("secret value is too short to be redacted from outputs",
				zap.String("secret", ref.Name), zap.String("ref", ref.Ref), zap.Int("minRedactLen", MinRedactLen))
		}
		out[ref.Name] = v
	}
	return out, nil
}

func (r *Resolver) logger() *zap.Logger {
	if r.Logger == nil {
		return zap.NewNop()
	}
	return r.Logger
}

func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("name is empty")
	case len(name) > maxNameLen:
		return fmt.Errorf("name is longer than %d bytes", maxNameLen)
	case strings.ContainsAny(name, "=}\x00"):
		return errors.New("name contains '=', '}' or a NUL byte")
	}
	return nil
}

func (r *Resolver) resolve(ref plan.SecretRef) (string, error) {
	provider, loc, ok := strings.Cut(ref.Ref, ":")
	fail := func(code, reason string, retryable bool, cause error) error {
		return &Error{Code: code, Name: ref.Name, Ref: ref.Ref, Reason: reason, Retryable: retryable, Err: cause}
	}
	if !ok || loc == "" {
		return "", fail(CodeInvalidRef, `ref must be "env:VAR" or "file:/path"`, false, nil)
	}
	switch provider {
	case ProviderEnv:
		if strings.ContainsAny(loc, "=\x00") {
			return "", fail(CodeInvalidRef, "variable name contains '=' or a NUL byte", false, nil)
		}
		lookup := r.LookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		v, found := lookup(loc)
		if !found {
			return "", fail(CodeNotFound, "environment variable is not set", false, nil)
		}
		return v, nil
	case ProviderFile:
		if strings.ContainsRune(loc, 0) {
			return "", fail(CodeInvalidRef, "path contains a NUL byte", false, nil)
		}
		return r.readFile(loc, fail)
	default:
		return "", fail(CodeInvalidRef, fmt.Sprintf("unknown provider %q (want env or file)", provider), false, nil)
	}
}

func (r *Resolver) readFile(path string, fail func(code, reason string, retryable bool, cause error) error) (string, error) {
	limit := r.MaxFileBytes
	if limit <= 0 {
		limit = DefaultMaxFileBytes
	}
	classify := func(op string, err error) error {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fail(CodeNotFound, "file does not exist", false, err)
		case errors.Is(err, fs.ErrPermission):
			return fail(CodeUnreadable, "permission denied", false, err)
		default:
			return fail(CodeUnreadable, op+" failed", true, err)
		}
	}
	// Stat first: opening a FIFO would block.
	fi, err := os.Stat(path)
	if err != nil {
		return "", classify("stat", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fail(CodeUnreadable, "not a regular file ("+fi.Mode().Type().String()+")", false, nil)
	}
	if fi.Size() > limit {
		return "", fail(CodeTooLarge, fmt.Sprintf("file is larger than %d bytes", limit), false, nil)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", classify("open", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return "", classify("read", err)
	}
	if int64(len(b)) > limit {
		return "", fail(CodeTooLarge, fmt.Sprintf("file is larger than %d bytes", limit), false, nil)
	}
	s := string(b)
	if strings.HasSuffix(s, "\r\n") {
		s = s[:len(s)-2]
	} else if strings.HasSuffix(s, "\n") {
		s = s[:len(s)-1]
	}
	return s, nil
}
