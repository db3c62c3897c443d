package secrets

import (
	"bytes"
	"encoding/json"
	"net/url"
	"slices"
	"sort"
)

// Placeholder replaces every redacted span.
const Placeholder = "[REDACTED]"

// MinRedactLen is the shortest secret value a Redactor redacts. Shorter
// values would turn ordinary output into noise (a one-byte secret "a"
// would redact every "a") and are not real secrets; the Resolver warns
// about them.
const MinRedactLen = 4

// Redactor replaces secret values with Placeholder. It redacts every value
// of at least MinRedactLen bytes, and also the value's URL query-escaped,
// URL path-escaped (as a segment and as a whole path) and
// JSON-string-escaped forms (an http executor's URL
// appears escaped in Go's transport errors). Overlapping and adjacent
// occurrences of different secrets are merged into one Placeholder, so no
// byte of any secret survives. A nil *Redactor, or one without values,
// returns its input unchanged. A Redactor is immutable and safe for
// concurrent use.
type Redactor struct {
	needles [][]byte
}

// NewRedactor returns a Redactor for the given secret values (for
// instance the map values of Resolver.Resolve).
func NewRedactor(values ...string) *Redactor {
	seen := map[string]bool{}
	var needles [][]byte
	add := func(s string) {
		if len(s) >= MinRedactLen && !seen[s] {
			seen[s] = true
			needles = append(needles, []byte(s))
		}
	}
	for _, v := range values {
		add(v)
		add(url.QueryEscape(v))
		add(url.PathEscape(v))
		add((&url.URL{Path: v}).EscapedPath())
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if enc.Encode(v) == nil {
			js := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
			add(string(js[1 : len(js)-1]))
		}
	}
	// Longest first only makes the output deterministic; correctness comes
	// from the span merge.
	sort.SliceStable(needles, func(i, j int) bool { return len(needles[i]) > len(needles[j]) })
	return &Redactor{needles: needles}
}

// NewRedactorMap returns a Redactor for the values of m.
func NewRedactorMap(m map[string]string) *Redactor {
	vals := make([]string, 0, len(m))
	for _, v := range m {
		vals = append(vals, v)
	}
	slices.Sort(vals)
	return NewRedactor(vals...)
}

// Empty reports whether r redacts nothing.
func (r *Redactor) Empty() bool { return r == nil || len(r.needles) == 0 }

// String returns s with every secret replaced by Placeholder.
func (r *Redactor) String(s string) string {
	if r.Empty() {
		return s
	}
	return string(r.Fragment([]byte(s), false, false))
}

// Bytes returns b with every secret replaced by Placeholder. It returns b
// itself when nothing was redacted, a new slice otherwise.
func (r *Redactor) Bytes(b []byte) []byte { return r.Fragment(b, false, false) }

// Fragment is Bytes for a piece cut out of a longer stream (a bounded
// capture keeps a head and a tail). cutBefore says bytes preceded b and
// were dropped, so a leading proper suffix of a secret is redacted too;
// cutAfter says bytes followed b, so a trailing proper prefix of a secret
// is redacted. This errs on the side of redacting a few innocent bytes at
// a cut rather than leaking the start or the end of a secret.
func (r *Redactor) Fragment(b []byte, cutBefore, cutAfter bool) []byte {
	if r.Empty() || len(b) == 0 {
		return b
	}
	var spans [][2]int
	for _, n := range r.needles {
		for off := 0; off < len(b); {
			i := bytes.Index(b[off:], n)
			if i < 0 {
				break
			}
			spans = append(spans, [2]int{off + i, off + i + len(n)})
			off += i + 1
		}
		if cutBefore {
			// Longest proper suffix of n that b starts with.
			for k := min(len(n)-1, len(b)); k >= 1; k-- {
				if bytes.HasPrefix(b, n[len(n)-k:]) {
					spans = append(spans, [2]int{0, k})
					break
				}
			}
		}
		if cutAfter {
			for k := min(len(n)-1, len(b)); k >= 1; k-- {
				if bytes.HasSuffix(b, n[:k]) {
					spans = append(spans, [2]int{len(b) - k, len(b)})
					break
				}
			}
		}
	}
	if len(spans) == 0 {
		return b
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	out := make([]byte, 0, len(b))
	pos := 0
	for i := 0; i < len(spans); {
		start, end := spans[i][0], spans[i][1]
		// Merge overlapping and touching spans.
		for i++; i < len(spans) && spans[i][0] <= end; i++ {
			end = max(end, spans[i][1])
		}
		out = append(out, b[pos:start]...)
		out = append(out, Placeholder...)
		pos = end
	}
	return append(out, b[pos:]...)
}
