package secrets_test

import (
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

func TestRedactor_Bytes(t *testing.T) {
	const R = secrets.Placeholder
	cases := []struct {
		name   string
		values []string
		in     string
		want   string
	}{
		{"None", nil, "hello", "hello"},
		{"One", []string{"hunter22"}, "pw=hunter22.", "pw=" + R + "."},
		{"Repeated", []string{"hunter22"}, "hunter22hunter22 hunter22", R + " " + R},
		{"ShortIgnored", []string{"abc"}, "abcabc", "abcabc"},
		{"EmptyIgnored", []string{""}, "abc", "abc"},
		{"Overlap", []string{"abcdef", "defghi"}, "xxabcdefghixx", "xx" + R + "xx"},
		{"Nested", []string{"secret-long", "long"}, "a secret-long b long", "a " + R + " b " + R},
		{"SelfOverlap", []string{"aaaa"}, "aaaaaa", R},
		{"QueryEscaped", []string{"p@ss word&x"}, "u?q=p%40ss+word%26x", "u?q=" + R},
		{"PathEscaped", []string{"p@ss word/x"}, "/p@ss%20word%2Fx/", "/" + R + "/"},
		{"WholePathEscaped", []string{"p@ss w/rd&x=é"}, "/a/p@ss%20w/rd&x=%C3%A9?", "/a/" + R + "?"},
		{"JSONEscaped", []string{`he said "hi"` + "\n"}, `{"m":"he said \"hi\"\n"}`, `{"m":"` + R + `"}`},
		{"Multiline", []string{"line1\nline2"}, "x line1\nline2 y", "x " + R + " y"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := secrets.NewRedactor(tc.values...)
			if got := string(r.Bytes([]byte(tc.in))); got != tc.want {
				t.Errorf("Bytes: got %q want %q", got, tc.want)
			}
			if got := r.String(tc.in); got != tc.want {
				t.Errorf("String: got %q want %q", got, tc.want)
			}
		})
	}
	t.Run("Nil", func(t *testing.T) {
		var r *secrets.Redactor
		if got := r.String("x"); got != "x" || !r.Empty() {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("Map", func(t *testing.T) {
		r := secrets.NewRedactorMap(map[string]string{"A": "alpha-1", "B": "bravo-2"})
		if got := r.String("alpha-1 bravo-2"); got != secrets.Placeholder+" "+secrets.Placeholder {
			t.Fatalf("got %q", got)
		}
	})
}

func TestRedactor_Fragment(t *testing.T) {
	const R = secrets.Placeholder
	r := secrets.NewRedactor("0123456789")
	cases := []struct {
		name                string
		in                  string
		cutBefore, cutAfter bool
		want                string
	}{
		{"NoCut", "xx01234", false, false, "xx01234"},
		{"CutAfterPrefix", "xx01234", false, true, "xx" + R},
		{"CutBeforeSuffix", "6789yy", true, false, R + "yy"},
		{"BothCuts", "789 mid 012", true, true, R + " mid " + R},
		{"CutButNoPartial", "abc", true, true, "abc"},
		{"WholeInside", "a0123456789b", true, true, "a" + R + "b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(r.Fragment([]byte(tc.in), tc.cutBefore, tc.cutAfter)); got != tc.want {
				t.Errorf("got %q want %q", got, tc.want)
			}
		})
	}
}

func FuzzRedactor_Bytes(f *testing.F) {
	f.Add("hunter22", "xx hunter22 yy", 3)
	f.Add("aaaa", "aaaaaaaaa", 0)
	f.Fuzz(func(t *testing.T, secret, text string, at int) {
		if len(secret) < secrets.MinRedactLen || strings.ContainsRune(secret, 0) {
			return
		}
		if at < 0 {
			at = -at
		}
		at %= len(text) + 1
		in := text[:at] + secret + text[at:]
		// The placeholder's own bytes next to the text could spell the
		// secret ("ED]x"); what matters is that no original byte survives.
		out := strings.ReplaceAll(secrets.NewRedactor(secret).String(in), secrets.Placeholder, "\x00")
		if strings.Contains(out, secret) {
			t.Fatalf("secret %q survives in %q", secret, out)
		}
	})
}
