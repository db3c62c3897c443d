package main

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Text from the API (reasons, messages, ids, labels) may hold what a
// terminal obeys: ESC sequences that retitle the window, clear the screen
// or rewrite earlier lines, their C1 forms, and newlines that forge lines
// of a table. The CLI never writes such a character raw:
//
//   - escapeText escapes one field of human-readable output: newline, tab
//     and carriage return as \n, \t and \r, every other C0 character, DEL
//     and C1 as \u00XX (ESC is \u001b), a Unicode direction control as
//     \uXXXX (U+202E, which reverses the rest of a line, is \u202e), and
//     an invalid UTF-8 byte as \xXX;
//   - safeWriter, around the CLI's stdout and stderr, does the same for
//     everything but newline and tab, so no output (text, JSON, usage,
//     errors) carries a terminal control character.
//
// In JSON output the characters escaped are inside strings, where \u00XX
// and \r are the same value: the document decodes to the same data.

// escapeText returns s with every control character escaped (C0 including
// newline and tab, DEL, C1) and invalid UTF-8 bytes as \xXX: one line,
// safe to print on a terminal.
func escapeText(s string) string {
	if !needsEscape(s, false) {
		return s
	}
	var b strings.Builder
	appendEscaped(&b, []byte(s), false)
	return b.String()
}

// needsEscape reports whether s has a character escapeText (or, with
// keepLayout, safeWriter) would escape.
func needsEscape(s string, keepLayout bool) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || isControl(r, keepLayout) {
			return true
		}
		i += size
	}
	return false
}

func isControl(r rune, keepLayout bool) bool {
	if keepLayout && (r == '\n' || r == '\t') {
		return false
	}
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || isBidiControl(r)
}

// isBidiControl reports whether r is a Unicode direction control (marks,
// embeddings, overrides, isolates): printed raw, U+202E turns the rest of
// a line around ("plan-\u202egnp.exe" shows as "plan-exe.png"). The
// console shows them as <U+XXXX>.
func isBidiControl(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

// appendEscaped writes p to b with control characters escaped; an
// incomplete rune at the end is escaped byte by byte.
func appendEscaped(b *strings.Builder, p []byte, keepLayout bool) {
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(b, `\x%02x`, p[i])
		case r == '\n' && !keepLayout:
			b.WriteString(`\n`)
		case r == '\t' && !keepLayout:
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case isControl(r, keepLayout):
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.Write(p[i : i+size])
		}
		i += size
	}
}

// safeWriter escapes terminal control characters (all but newline and
// tab) in what it writes to w. A rune split across two writes is held
// until the next one; Flush writes what is held.
type safeWriter struct {
	w       io.Writer
	pending []byte
}

func (s *safeWriter) Write(p []byte) (int, error) {
	data := p
	if len(s.pending) > 0 {
		data = append(s.pending, p...)
		s.pending = nil
	}
	// Hold an incomplete rune at the end (at most 3 bytes).
	cut := len(data)
	for k := 1; k <= 3 && k <= len(data); k++ {
		if utf8.RuneStart(data[len(data)-k]) {
			if !utf8.FullRune(data[len(data)-k:]) {
				cut = len(data) - k
			}
			break
		}
	}
	s.pending = append([]byte(nil), data[cut:]...)
	data = data[:cut]
	if !needsEscape(string(data), true) {
		if _, err := s.w.Write(data); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	var b strings.Builder
	appendEscaped(&b, data, true)
	if _, err := io.WriteString(s.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a held incomplete rune, escaped.
func (s *safeWriter) Flush() {
	if len(s.pending) > 0 {
		var b strings.Builder
		appendEscaped(&b, s.pending, true)
		s.pending = nil
		_, _ = io.WriteString(s.w, b.String())
	}
}

// shellWord is s as one word of a POSIX shell command line: as it is when
// it holds only characters no shell treats specially, else in single
// quotes (a single quote inside closes the quoting, is escaped with a
// backslash, and reopens it). A command the CLI suggests pasting quotes
// every value it did not choose itself.
func shellWord(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("_./:=,@%+-", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellCommand is "sidecar" with verb and the positional args as shell
// words, with -- before the positionals when one starts with a dash (so
// that it is not read as a flag); the line is then escaped for the
// terminal (escapeText).
func shellCommand(verb string, args ...string) string {
	words := []string{"sidecar", verb}
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			words = append(words, "--")
			break
		}
	}
	for _, a := range args {
		words = append(words, shellWord(a))
	}
	return escapeText(strings.Join(words, " "))
}
