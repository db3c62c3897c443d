package secrets_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

const secretValue = "s3cr3t-VALUE-never-shown"

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestResolver_Resolve(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("plain", secretValue, 0o600)
	nl := write("nl", secretValue+"\n", 0o600)
	twoNL := write("twonl", secretValue+"\n\n", 0o600)
	crlf := write("crlf", secretValue+"\r\n", 0o600)
	big := write("big", strings.Repeat("x", 100), 0o600)
	noPerm := write("noperm", secretValue, 0o000)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &secrets.Resolver{LookupEnv: env(map[string]string{"TOKEN": secretValue, "EMPTY": ""}), EnvAllow: []string{"*"}, MaxFileBytes: 64, FileRoots: []string{dir}}

	t.Run("OK", func(t *testing.T) {
		got, err := r.Resolve(context.Background(), []plan.SecretRef{
			{Name: "A", Ref: "env:TOKEN"}, {Name: "B", Ref: "file:" + plain}, {Name: "C", Ref: "file:" + nl},
			{Name: "D", Ref: "file:" + twoNL}, {Name: "E", Ref: "file:" + crlf}, {Name: "F", Ref: "env:EMPTY"},
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"A": secretValue, "B": secretValue, "C": secretValue, "D": secretValue + "\n",
			"E": secretValue, "F": ""}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: got %q want %q", k, got[k], v)
			}
		}
		if len(got) != len(want) {
			t.Errorf("got %d values want %d", len(got), len(want))
		}
	})
	t.Run("Empty", func(t *testing.T) {
		got, err := r.Resolve(context.Background(), nil)
		if err != nil || len(got) != 0 {
			t.Fatalf("got %v, %v", got, err)
		}
	})

	cases := []struct {
		name      string
		ref       plan.SecretRef
		code      string
		retryable bool
	}{
		{"EnvUnset", plan.SecretRef{Name: "A", Ref: "env:NOPE"}, secrets.CodeNotFound, false},
		{"FileMissing", plan.SecretRef{Name: "A", Ref: "file:" + filepath.Join(dir, "missing")}, secrets.CodeNotFound, false},
		{"Directory", plan.SecretRef{Name: "A", Ref: "file:" + dir}, secrets.CodeUnreadable, false},
		{"FIFO", plan.SecretRef{Name: "A", Ref: "file:" + fifo}, secrets.CodeUnreadable, false},
		{"TooLarge", plan.SecretRef{Name: "A", Ref: "file:" + big}, secrets.CodeTooLarge, false},
		{"NoProvider", plan.SecretRef{Name: "A", Ref: "TOKEN"}, secrets.CodeInvalidRef, false},
		{"UnknownProvider", plan.SecretRef{Name: "A", Ref: "vault:x/y"}, secrets.CodeInvalidRef, false},
		{"EmptyLocator", plan.SecretRef{Name: "A", Ref: "env:"}, secrets.CodeInvalidRef, false},
		{"EmptyRef", plan.SecretRef{Name: "A"}, secrets.CodeInvalidRef, false},
		{"EmptyName", plan.SecretRef{Ref: "env:TOKEN"}, secrets.CodeInvalidRef, false},
		{"NameWithEquals", plan.SecretRef{Name: "A=B", Ref: "env:TOKEN"}, secrets.CodeInvalidRef, false},
		{"EnvNUL", plan.SecretRef{Name: "A", Ref: "env:TO\x00KEN"}, secrets.CodeInvalidRef, false},
		{"FileNUL", plan.SecretRef{Name: "A", Ref: "file:/x\x00y"}, secrets.CodeInvalidRef, false},
	}
	if os.Geteuid() != 0 { // root reads anything
		cases = append(cases, struct {
			name      string
			ref       plan.SecretRef
			code      string
			retryable bool
		}{"Permission", plan.SecretRef{Name: "A", Ref: "file:" + noPerm}, secrets.CodeUnreadable, false})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(context.Background(), []plan.SecretRef{tc.ref})
			if got != nil {
				t.Errorf("got values %v on error", got)
			}
			var se *secrets.Error
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want *secrets.Error", err)
			}
			if se.Code != tc.code || se.Retryable != tc.retryable {
				t.Errorf("got code %s retryable %v, want %s %v (%v)", se.Code, se.Retryable, tc.code, tc.retryable, err)
			}
			if errcode.CodeOf(err) != tc.code {
				t.Errorf("errcode.CodeOf: got %q want %q", errcode.CodeOf(err), tc.code)
			}
			if !errors.Is(err, &secrets.Error{Code: tc.code}) {
				t.Errorf("errors.Is by code failed")
			}
			if strings.Contains(err.Error(), secretValue) || strings.Contains(se.StepError().Message, secretValue) {
				t.Errorf("error contains the secret: %v", err)
			}
		})
	}
	t.Run("Duplicate", func(t *testing.T) {
		_, err := r.Resolve(context.Background(), []plan.SecretRef{{Name: "A", Ref: "env:TOKEN"}, {Name: "A", Ref: "file:" + plain}})
		if !errors.Is(err, secrets.ErrInvalidRef) {
			t.Fatalf("got %v want SECRET_REF_INVALID", err)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := r.Resolve(ctx, []plan.SecretRef{{Name: "A", Ref: "env:TOKEN"}}); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v want context.Canceled", err)
		}
	})
	t.Run("ShortValueWarns", func(t *testing.T) {
		core, logs := observer.New(zap.DebugLevel)
		r := &secrets.Resolver{LookupEnv: env(map[string]string{"S": "ab"}), EnvAllow: []string{"S"}, Logger: zap.New(core)}
		if _, err := r.Resolve(context.Background(), []plan.SecretRef{{Name: "SHORT", Ref: "env:S"}}); err != nil {
			t.Fatal(err)
		}
		if logs.FilterMessageSnippet("too short").Len() != 1 {
			t.Fatalf("got logs %v, want one warning", logs.All())
		}
		for _, e := range logs.All() {
			for _, f := range e.Context {
				if f.String == "ab" {
					t.Errorf("log field %s carries the value", f.Key)
				}
			}
		}
	})
}

func TestResolver_FileRoots(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	other := filepath.Join(base, "rootother") // shares root's prefix, not a subdirectory
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, filepath.Join(root, "sub"), other, outside} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string) string {
		if err := os.WriteFile(p, []byte(secretValue+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, name string) string {
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
		return name
	}
	inside := write(filepath.Join(root, "sub", "token"))
	secretOut := write(filepath.Join(outside, "shadow"))
	write(filepath.Join(other, "token"))
	link(secretOut, filepath.Join(root, "out-link"))                          // a symlink inside the root to a file outside
	link(outside, filepath.Join(root, "out-dir"))                             // a symlinked directory leading out
	link(filepath.Join(root, "sub"), filepath.Join(root, "in"))               // a symlink that stays inside
	link(root, filepath.Join(base, "root-link"))                              // a root given through a symlink
	link(filepath.Join(root, "sub", "token"), filepath.Join(outside, "back")) // outside, pointing in
	t.Chdir(root)

	tests := []struct {
		name  string
		roots []string
		ref   string
		code  string // "" : resolves
	}{
		{"Inside", []string{root}, inside, ""},
		{"InsideTrailingSlashRoot", []string{root + "/"}, inside, ""},
		{"SymlinkStaysInside", []string{root}, filepath.Join(root, "in", "token"), ""},
		{"RootIsSymlink", []string{filepath.Join(base, "root-link")}, filepath.Join(base, "root-link", "sub", "token"), ""},
		{"RootIsSymlinkPathReal", []string{filepath.Join(base, "root-link")}, inside, ""},
		{"Relative", []string{root}, "sub/token", ""},
		{"RelativeRoot", []string{"."}, inside, ""},
		{"SecondRoot", []string{outside, root}, inside, ""},
		{"NoRoot", nil, inside, secrets.CodeForbidden},
		{"Outside", []string{root}, secretOut, secrets.CodeForbidden},
		{"EtcShadow", []string{root}, "/etc/shadow", secrets.CodeForbidden},
		{"OutsideMissing", []string{root}, filepath.Join(outside, "missing"), secrets.CodeForbidden},
		{"DotDot", []string{root}, filepath.Join(root, "sub", "..", "..", "outside", "shadow"), secrets.CodeForbidden},
		{"DotDotUnclean", []string{root}, root + "/../outside/shadow", secrets.CodeForbidden},
		{"RelativeDotDot", []string{root}, "../outside/shadow", secrets.CodeForbidden},
		{"SymlinkOut", []string{root}, filepath.Join(root, "out-link"), secrets.CodeForbidden},
		{"SymlinkDirOut", []string{root}, filepath.Join(root, "out-dir", "shadow"), secrets.CodeForbidden},
		{"PrefixSibling", []string{root}, filepath.Join(other, "token"), secrets.CodeForbidden},
		{"OutsidePointingIn", []string{root}, filepath.Join(outside, "back"), secrets.CodeForbidden},
		{"MissingInside", []string{root}, filepath.Join(root, "missing"), secrets.CodeNotFound},
		{"RootMissing", []string{filepath.Join(base, "nope")}, inside, secrets.CodeForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &secrets.Resolver{FileRoots: tt.roots}
			got, err := r.Resolve(context.Background(), []plan.SecretRef{{Name: "A", Ref: "file:" + tt.ref}})
			if tt.code == "" {
				if err != nil || got["A"] != secretValue {
					t.Fatalf("got %q, %v; want the value", got["A"], err)
				}
				return
			}
			if code := errcode.CodeOf(err); code != tt.code {
				t.Fatalf("got %v (code %q), want %s", err, code, tt.code)
			}
			if tt.code == secrets.CodeForbidden {
				if !errors.Is(err, secrets.ErrForbidden) {
					t.Errorf("errors.Is(err, ErrForbidden) is false: %v", err)
				}
				var se *secrets.Error
				if !errors.As(err, &se) || se.Retryable {
					t.Errorf("want a non-retryable *secrets.Error, got %#v", err)
				}
				if strings.Contains(err.Error(), "shadow") && !strings.Contains(tt.ref, "shadow") {
					t.Errorf("the error names the symlink's target: %v", err)
				}
			}
		})
	}
}

// TestResolver_EnvAllow: env: secrets resolve only the variables EnvAllow
// names (NAME or PREFIX*); none named refuses every env: reference.
func TestResolver_EnvAllow(t *testing.T) {
	lookup := env(map[string]string{"CI_TOKEN": "ci-token-value", "DEPLOY_KEY": "deploy-key-value", "AWS_SECRET_ACCESS_KEY": "aws-value"})
	for _, tc := range []struct {
		allow []string
		ref   string
		ok    bool
	}{
		{nil, "env:CI_TOKEN", false},
		{[]string{}, "env:CI_TOKEN", false},
		{[]string{"CI_TOKEN"}, "env:CI_TOKEN", true},
		{[]string{"CI_TOKEN"}, "env:AWS_SECRET_ACCESS_KEY", false},
		{[]string{"DEPLOY_*"}, "env:DEPLOY_KEY", true},
		{[]string{"DEPLOY_*"}, "env:CI_TOKEN", false},
		{[]string{"*"}, "env:AWS_SECRET_ACCESS_KEY", true},
	} {
		r := &secrets.Resolver{LookupEnv: lookup, EnvAllow: tc.allow}
		vals, err := r.Resolve(context.Background(), []plan.SecretRef{{Name: "S", Ref: tc.ref}})
		switch {
		case tc.ok && (err != nil || vals["S"] == ""):
			t.Errorf("allow %q, %s: %v, want the value", tc.allow, tc.ref, err)
		case !tc.ok && (err == nil || errcode.CodeOf(err) != secrets.CodeForbidden):
			t.Errorf("allow %q, %s: %v, want %s", tc.allow, tc.ref, err, secrets.CodeForbidden)
		case !tc.ok && strings.Contains(err.Error(), "-value"):
			t.Errorf("the refusal shows a value: %v", err)
		}
	}
}
