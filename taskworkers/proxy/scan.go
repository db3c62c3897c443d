package proxy

import (
	"unicode/utf8"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// scanned is what scanTask read of a task's (or a task result's) JSON
// without decoding it: the top-level string fields taskId, workflowType
// and status, and whether inputData holds a non-null plan.InputStep.
type scanned struct {
	taskID, workflowType, status string
	stepInput                    bool
}

// scanTask reads the fields of scanned from one JSON object, as
// encoding/json would decode them into adapter.PolledTask or
// model.TaskResult. ok is false whenever the scan cannot be sure of
// that: anything but an object, a key that is escaped or not ASCII (it
// may fold onto a field's name), a field of these that appears twice
// (encoding/json merges or overwrites), a value of them that is not a
// plain string (inputData: not an object or null), an escaped or
// not-UTF-8 string, an escaped key inside inputData, or input it cannot
// follow. The caller then decodes the JSON in full.
func scanTask(b []byte) (s scanned, ok bool) {
	sc := scanner{b: b}
	if !sc.object(func(key []byte) bool {
		return sc.topField(key, &s)
	}) {
		return scanned{}, false
	}
	sc.space()
	if sc.i != len(b) {
		return scanned{}, false
	}
	return s, true
}

// scanner walks a JSON text; i is the next byte to read.
type scanner struct {
	b    []byte
	i    int
	seen uint8 // the top-level fields met, one bit each
}

const (
	seenTaskID = 1 << iota
	seenWorkflowType
	seenStatus
	seenInputData
)

// topField reads the value of a top-level key into s when it is one of
// scanned's, else skips it.
func (sc *scanner) topField(key []byte, s *scanned) bool {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return false // it may unescape or fold onto a field's name
		}
	}
	var bit uint8
	var dst *string
	switch {
	case foldEqual(key, "taskId"):
		bit, dst = seenTaskID, &s.taskID
	case foldEqual(key, "workflowType"):
		bit, dst = seenWorkflowType, &s.workflowType
	case foldEqual(key, "status"):
		bit, dst = seenStatus, &s.status
	case foldEqual(key, "inputData"):
		bit = seenInputData
	default:
		return sc.skip(0)
	}
	if sc.seen&bit != 0 {
		return false
	}
	sc.seen |= bit
	if dst == nil {
		return sc.inputData(s)
	}
	v, ok := sc.plainString()
	if ok {
		*dst = string(v)
	}
	return ok
}

// inputData reads inputData's value: null, or an object whose keys are
// read for plan.InputStep (the last of them, as encoding/json keeps).
func (sc *scanner) inputData(s *scanned) bool {
	sc.space()
	if sc.literal("null") {
		return true
	}
	return sc.object(func(key []byte) bool {
		for _, c := range key {
			if c == '\\' {
				return false // it may unescape to plan.InputStep
			}
		}
		if string(key) != plan.InputStep {
			return sc.skip(0)
		}
		sc.space()
		s.stepInput = !sc.literal("null")
		return s.stepInput == false || sc.skip(0)
	})
}

// object reads an object, handing each key (raw, between its quotes) to
// field, which must read the value.
func (sc *scanner) object(field func(key []byte) bool) bool {
	sc.space()
	if sc.i >= len(sc.b) || sc.b[sc.i] != '{' {
		return false
	}
	sc.i++
	sc.space()
	if sc.i < len(sc.b) && sc.b[sc.i] == '}' {
		sc.i++
		return true
	}
	for {
		sc.space()
		key, ok := sc.rawString()
		if !ok {
			return false
		}
		sc.space()
		if sc.i >= len(sc.b) || sc.b[sc.i] != ':' {
			return false
		}
		sc.i++
		if !field(key) {
			return false
		}
		sc.space()
		if sc.i >= len(sc.b) {
			return false
		}
		switch sc.b[sc.i] {
		case ',':
			sc.i++
		case '}':
			sc.i++
			return true
		default:
			return false
		}
	}
}

// rawString reads a string and returns its bytes between the quotes,
// escapes left as they are.
func (sc *scanner) rawString() ([]byte, bool) {
	if sc.i >= len(sc.b) || sc.b[sc.i] != '"' {
		return nil, false
	}
	start := sc.i + 1
	for j := start; j < len(sc.b); j++ {
		switch c := sc.b[j]; {
		case c == '"':
			sc.i = j + 1
			return sc.b[start:j], true
		case c == '\\':
			j++ // the escaped byte; a \uXXXX's digits are plain bytes
		case c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// plainString reads a string value that encoding/json would decode to
// its bytes as they are: valid UTF-8, no escapes.
func (sc *scanner) plainString() ([]byte, bool) {
	sc.space()
	v, ok := sc.rawString()
	if !ok || !utf8.Valid(v) {
		return nil, false
	}
	for _, c := range v {
		if c == '\\' {
			return nil, false
		}
	}
	return v, true
}

// skip passes over one value (depth: of the containers it is in).
func (sc *scanner) skip(depth int) bool {
	sc.space()
	if sc.i >= len(sc.b) || depth > maxScanDepth {
		return false
	}
	switch c := sc.b[sc.i]; {
	case c == '"':
		_, ok := sc.rawString()
		return ok
	case c == '{':
		return sc.object(func([]byte) bool { return sc.skip(depth + 1) })
	case c == '[':
		sc.i++
		sc.space()
		if sc.i < len(sc.b) && sc.b[sc.i] == ']' {
			sc.i++
			return true
		}
		for {
			if !sc.skip(depth + 1) {
				return false
			}
			sc.space()
			if sc.i >= len(sc.b) {
				return false
			}
			switch sc.b[sc.i] {
			case ',':
				sc.i++
			case ']':
				sc.i++
				return true
			default:
				return false
			}
		}
	case c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n':
		// A number or a literal: up to the next delimiter. (The JSON is
		// encoding/json's to judge; a scan only needs where it ends.)
		start := sc.i
		for sc.i < len(sc.b) {
			switch sc.b[sc.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return sc.i > start
			}
			sc.i++
		}
		return sc.i > start
	}
	return false
}

// maxScanDepth bounds the nesting the scan follows (encoding/json's own
// limit is 10000); deeper input is decoded in full.
const maxScanDepth = 1000

// literal reads lit when it comes next.
func (sc *scanner) literal(lit string) bool {
	if len(sc.b)-sc.i < len(lit) || string(sc.b[sc.i:sc.i+len(lit)]) != lit {
		return false
	}
	end := sc.i + len(lit)
	if end < len(sc.b) {
		switch sc.b[end] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
		default:
			return false
		}
	}
	sc.i = end
	return true
}

func (sc *scanner) space() {
	for sc.i < len(sc.b) {
		switch sc.b[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// foldEqual reports whether key, raw from the JSON, names field as
// encoding/json matches names, for an ASCII key: equal to field but for
// case. (A key with an escape or a byte past ASCII never comes here:
// topField gives up on it.)
func foldEqual(key []byte, field string) bool {
	if len(key) != len(field) {
		return false
	}
	for i := range len(key) {
		a, b := key[i], field[i]
		if 'a' <= a && a <= 'z' {
			a -= 'a' - 'A'
		}
		if 'a' <= b && b <= 'z' {
			b -= 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}
