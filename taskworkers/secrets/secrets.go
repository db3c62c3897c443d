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
	"path/filepath"
	"strings"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// Providers, the prefixes of SecretRef.Ref.
const (
	// ProviderEnv reads the worker's environment: "env:VAR".
	ProviderEnv = "env"
	// ProviderFile reads a file: "file:/path", only below one of
	// Resolver.FileRoots. One trailing newline ("\n" or "\r\n") is
	// removed. A relative path is relative to the worker's working
	// directory.
	ProviderFile = "file"
)

// DefaultMaxFileBytes is the default size limit of a file: secret.
const DefaultMaxFileBytes = 64 << 10

// maxNameLen bounds SecretRef.Name.
const maxNameLen = 256

// Resolver resolves secret references with the env: and file: providers.
// The zero value is ready to use; exported fields may be set before first
// use. A Resolver is safe for concurrent use.
type Resolver struct {
	// LookupEnv reads the environment (default os.LookupEnv).
	LookupEnv func(key string) (string, bool)
	// EnvAllow names the variables env: secrets may read: a name, or a
	// prefix followed by '*' ("*" alone allows every variable). A
	// variable no entry matches fails with SECRET_REF_FORBIDDEN; with no
	// entry every env: reference does (fail closed), so a plan cannot
	// read the worker's own credentials (AWS_SECRET_ACCESS_KEY,
	// PGPASSWORD, ...) through env:.
	EnvAllow []string
	// MaxFileBytes bounds a file: secret (default DefaultMaxFileBytes).
	MaxFileBytes int64
	// FileRoots are the directories file: secrets may be read from. A
	// path is resolved (symlinks, "..", relative to the working
	// directory) before it is checked, so a symlink inside a root that
	// points outside every root is refused, and the file is then opened
	// through os.Root so that a symlink swapped in after the check cannot
	// escape either. With no root, every file: reference fails with
	// SECRET_REF_FORBIDDEN (fail closed). Roots may be relative (to the
	// working directory) and may themselves be symlinks.
	FileRoots []string
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
		if !envAllowed(r.EnvAllow, loc) {
			reason := "variable is not in the allowed list (--secret-env-allow)"
			if len(r.EnvAllow) == 0 {
				reason = "no variable is allowed (--secret-env-allow), so env: secrets are refused"
			}
			return "", fail(CodeForbidden, reason, false, nil)
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

// envAllowed reports whether name matches one of allow (NAME or PREFIX*).
func envAllowed(allow []string, name string) bool {
	for _, p := range allow {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if p == name {
			return true
		}
	}
	return false
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
	root, rel, err := r.locate(path)
	if err != nil {
		if errors.Is(err, errOutsideRoots) {
			return "", fail(CodeForbidden, err.Error(), false, nil)
		}
		return "", classify("resolve", err)
	}
	// Through os.Root: a component replaced by a symlink out of the root
	// after locate is refused by the kernel-side walk, not followed.
	fsRoot, err := os.OpenRoot(root)
	if err != nil {
		return "", classify("open root", err)
	}
	defer fsRoot.Close()
	// Stat first: opening a FIFO would block.
	fi, err := fsRoot.Stat(rel)
	if err != nil {
		return "", r.classifyRoot(path, "stat", err, classify, fail)
	}
	if !fi.Mode().IsRegular() {
		return "", fail(CodeUnreadable, "not a regular file ("+fi.Mode().Type().String()+")", false, nil)
	}
	if fi.Size() > limit {
		return "", fail(CodeTooLarge, fmt.Sprintf("file is larger than %d bytes", limit), false, nil)
	}
	f, err := fsRoot.Open(rel)
	if err != nil {
		return "", r.classifyRoot(path, "open", err, classify, fail)
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

// errOutsideRoots is locate's refusal; readFile turns it into
// SECRET_REF_FORBIDDEN. Its text never names the resolved target, only
// that the path is not below a root.
var errOutsideRoots = errors.New("path is outside the configured secret file roots (--secret-file-root)")

// errNoRoots is errOutsideRoots when no root is configured.
var errNoRoots = fmt.Errorf("%w: none is configured, so file: secrets are refused", errOutsideRoots)

// classifyRoot maps an error of the os.Root walk. The walk refuses a
// symlink out of the root (one swapped in after locate) with an
// unexported error: when locating the path again now puts it outside every
// root, the error is SECRET_REF_FORBIDDEN; otherwise classify's.
func (r *Resolver) classifyRoot(path, op string, err error, classify func(string, error) error, fail func(string, string, bool, error) error) error {
	if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
		if _, _, lerr := r.locate(path); errors.Is(lerr, errOutsideRoots) {
			return fail(CodeForbidden, errOutsideRoots.Error(), false, nil)
		}
	}
	return classify(op, err)
}

// locate resolves path (absolute, symlinks and ".." evaluated) and returns
// the resolved root that contains it and the path relative to that root.
// A path that is lexically outside every root is refused before anything
// is looked up, so a plan cannot probe which files exist elsewhere.
func (r *Resolver) locate(path string) (root, rel string, err error) {
	if len(r.FileRoots) == 0 {
		return "", "", errNoRoots
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", "", err
	}
	type rootPair struct{ given, real string }
	var roots []rootPair
	for _, root := range r.FileRoots {
		given, err := filepath.Abs(root)
		if err != nil {
			continue
		}
		real, err := filepath.EvalSymlinks(given)
		if err != nil {
			r.logger().Warn("secret file root cannot be resolved; it is skipped", zap.String("root", root), zap.Error(err))
			continue
		}
		roots = append(roots, rootPair{given, real})
	}
	lexical := false
	for _, root := range roots {
		if within(abs, root.given) || within(abs, root.real) {
			lexical = true
			break
		}
	}
	if !lexical {
		return "", "", errOutsideRoots
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", "", err
	}
	for _, root := range roots {
		if within(real, root.real) {
			rel, err := filepath.Rel(root.real, real)
			if err != nil {
				return "", "", err
			}
			return root.real, rel, nil
		}
	}
	return "", "", errOutsideRoots
}

// within reports whether the clean absolute path p is root or below it.
func within(p, root string) bool {
	if p == root {
		return true
	}
	if !strings.HasSuffix(root, string(filepath.Separator)) {
		root += string(filepath.Separator)
	}
	return strings.HasPrefix(p, root)
}
