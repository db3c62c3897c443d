package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Parse decodes a plan from JSON or YAML, told apart by content: a document
// whose first non-blank character is '{' is JSON, anything else is YAML.
// Decoding is strict in both: field names are matched exactly (case
// included), unknown fields, duplicate keys, values of the wrong type and
// trailing data are refused, and a document over MaxPlanBytes or not valid
// UTF-8 is refused. Parse does not validate the plan (see Validate). Every
// failure is a *ValidationError with code PLAN_INVALID.
func Parse(data []byte) (*Plan, error) {
	if isJSON(data) {
		return ParseJSON(data)
	}
	return ParseYAML(data)
}

// ParseFile reads and parses a plan file: ".json" is JSON, ".yaml" and
// ".yml" are YAML, any other name is told apart by content as in Parse.
func ParseFile(path string) (*Plan, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		return ParseJSON(data)
	case ".yaml", ".yml":
		return ParseYAML(data)
	}
	return Parse(data)
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read plan: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxPlanBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read plan: %w", err)
	}
	return data, nil
}

// ParseJSON decodes a plan from JSON strictly, as Parse does.
func ParseJSON(data []byte) (*Plan, error) {
	if err := checkDocument(data); err != nil {
		return nil, err
	}
	data = trimBOM(data)
	var p Plan
	if err := decodeStrict(data, planSchema, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// UnmarshalJSON decodes p strictly, as ParseJSON does, so that a plan
// embedded in another JSON document (a run start request) gets the same
// checks. Errors are *ValidationError with code PLAN_INVALID.
func (p *Plan) UnmarshalJSON(data []byte) error {
	if err := checkDocument(data); err != nil {
		return err
	}
	var q Plan
	if err := decodeStrict(data, planSchema, &q); err != nil {
		return err
	}
	*p = q
	return nil
}

func isJSON(data []byte) bool {
	t := bytes.TrimLeft(trimBOM(data), " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

func trimBOM(data []byte) []byte { return bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) }

func checkDocument(data []byte) error {
	if len(data) > MaxPlanBytes {
		return docError(CodeTooLarge, "", "the document is over %d bytes", MaxPlanBytes)
	}
	if !utf8.Valid(data) {
		return docError(CodeSyntax, "", "the document is not valid UTF-8")
	}
	return nil
}

func docError(code, path, format string, args ...any) *ValidationError {
	return &ValidationError{Code: CodePlanInvalid, Problems: []Problem{{Code: code, Path: path, Message: fmt.Sprintf(format, args...)}}}
}

// kind is the JSON type a schema node accepts.
type kind int

const (
	kindString    kind = iota + 1
	kindInt            // a JSON number that is an integer in int64
	kindNumber         // any finite JSON number
	kindObject         // fields listed, names exact
	kindArray          // elements of elem
	kindStringMap      // an object of string values, any keys
	kindRaw            // any value: its Go type's UnmarshalJSON checks it
	kindBool           // true or false
)

// schema describes the accepted shape of a JSON value, for the strict
// decoder.
type schema struct {
	kind   kind
	fields map[string]*schema
	elem   *schema
}

var (
	stringSchema    = &schema{kind: kindString}
	intSchema       = &schema{kind: kindInt}
	numberSchema    = &schema{kind: kindNumber}
	stringMapSchema = &schema{kind: kindStringMap}

	executorSchema = &schema{kind: kindObject, fields: map[string]*schema{
		"type":            stringSchema,
		"argv":            {kind: kindArray, elem: stringSchema},
		"env":             stringMapSchema,
		"workingDir":      stringSchema,
		"method":          stringSchema,
		"url":             stringSchema,
		"headers":         stringMapSchema,
		"body":            stringSchema,
		"retryableStatus": {kind: kindArray, elem: intSchema},
		"seconds":         numberSchema,
		"taskType":        stringSchema,
		"input":           stringMapSchema,
	}}
	stepSchema = &schema{kind: kindObject, fields: map[string]*schema{
		"stepId":         stringSchema,
		"executor":       executorSchema,
		"dependsOn":      {kind: kindArray, elem: stringSchema},
		"timeoutSeconds": intSchema,
		"retries": {kind: kindObject, fields: map[string]*schema{
			"engineTries":     intSchema,
			"logicalAttempts": intSchema,
			"delaySeconds":    intSchema,
		}},
		"secrets": {kind: kindArray, elem: &schema{kind: kindObject, fields: map[string]*schema{
			"name": stringSchema,
			"ref":  stringSchema,
		}}},
		"join": stringSchema,
	}}
	planSchema = &schema{kind: kindObject, fields: map[string]*schema{
		"planId":        stringSchema,
		"planVersion":   stringSchema,
		"description":   stringSchema,
		"onStepFailure": stringSchema,
		"steps":         {kind: kindArray, elem: stepSchema},
	}}
)

// planNoMethods has Plan's fields without its UnmarshalJSON.
type planNoMethods Plan

// decodeStrict checks data against sch, then decodes it into v. The check
// locates every problem by JSON path; the decode after it cannot meet an
// unknown field, a case variant or a type mismatch.
func decodeStrict(data []byte, sch *schema, v any) error {
	return decodeWith(data, sch, v, CodePlanInvalid)
}

// decodeWith is decodeStrict with the code of the *ValidationError it
// returns for a problem of the document itself. An error of a kindRaw
// field's own UnmarshalJSON is returned as it is.
func decodeWith(data []byte, sch *schema, v any, code string) error {
	docErr := func(pcode, path, format string, args ...any) error {
		return &ValidationError{Code: code, Problems: []Problem{{Code: pcode, Path: path, Message: fmt.Sprintf(format, args...)}}}
	}
	w := walker{dec: json.NewDecoder(bytes.NewReader(data))}
	w.dec.UseNumber()
	if err := w.element(sch, ""); err != nil {
		return docErr(CodeSyntax, w.where(), "%s", syntaxMessage(err))
	}
	if _, err := w.dec.Token(); !errors.Is(err, io.EOF) {
		if err == nil {
			return docErr(CodeSyntax, "", "unexpected data after the document")
		}
		return docErr(CodeSyntax, "", "unexpected data after the document: %s", syntaxMessage(err))
	}
	if err := w.ps.err(code); err != nil {
		return err
	}
	if p, ok := v.(*Plan); ok {
		v = (*planNoMethods)(p)
	}
	if err := json.Unmarshal(data, v); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			return ve // a kindRaw field's own strict decoder (a plan inside a request)
		}
		// Unreachable after the walk; kept so that a gap in the schema
		// is an error, not a half-decoded value.
		return docErr(CodeSyntax, "", "%s", err.Error())
	}
	return nil
}

// Schema is the accepted shape of a JSON document for DecodeJSON: the
// plan decoder's rules applied to another document (a control API body).
type Schema struct{ s *schema }

// Shapes of DecodeJSON schema fields.
var (
	// JSONString accepts a string (or null).
	JSONString = Schema{stringSchema}
	// JSONInt accepts an integer that fits int64 (or null).
	JSONInt = Schema{intSchema}
	// JSONNumber accepts a finite number (or null).
	JSONNumber = Schema{numberSchema}
	// JSONBool accepts true or false (or null).
	JSONBool = Schema{&schema{kind: kindBool}}
	// JSONStringMap accepts an object of strings with any keys.
	JSONStringMap = Schema{stringMapSchema}
	// JSONStringList accepts an array of strings.
	JSONStringList = Schema{&schema{kind: kindArray, elem: stringSchema}}
	// JSONRaw accepts any value: the Go field's own UnmarshalJSON checks
	// it (a *Plan does, strictly).
	JSONRaw = Schema{&schema{kind: kindRaw}}
)

// JSONObject accepts an object with exactly these field names (case
// matters), each at most once.
func JSONObject(fields map[string]Schema) Schema {
	m := make(map[string]*schema, len(fields))
	for k, f := range fields {
		m[k] = f.s
	}
	return Schema{&schema{kind: kindObject, fields: m}}
}

// DecodeJSON decodes data into v as strictly as a plan is decoded: valid
// UTF-8 only, field names exactly as in sch (a case variant is refused
// with a hint), no field twice, the right JSON type for each, and nothing
// after the document. Every problem is located by its JSON path in a
// *ValidationError with the given code. A JSONRaw field's own decoding
// error (a *ValidationError of a plan) is returned as it is.
func DecodeJSON(data []byte, sch Schema, v any, code string) error {
	if !utf8.Valid(data) {
		return &ValidationError{Code: code, Problems: []Problem{{Code: CodeSyntax, Message: "the document is not valid UTF-8"}}}
	}
	return decodeWith(data, sch.s, v, code)
}

func syntaxMessage(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of the document"
	}
	return err.Error()
}

// walker walks a JSON token stream against a schema and collects problems.
// It returns an error only for malformed JSON, which stops the walk.
type walker struct {
	dec  *json.Decoder
	ps   problems
	last string
}

func (w *walker) where() string { return w.last }

func (w *walker) value(sch *schema, path string) error {
	w.last = path
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	return w.valueFrom(tok, sch, path)
}

func (w *walker) valueFrom(tok json.Token, sch *schema, path string) error {
	if sch == nil || sch.kind == kindRaw { // reported already, or checked by its own decoder
		return w.skip(tok)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			switch sch.kind {
			case kindObject:
				return w.object(sch, path)
			case kindStringMap:
				return w.stringMap(path)
			}
		case '[':
			if sch.kind == kindArray {
				return w.array(sch.elem, path)
			}
		}
		w.ps.add(CodeBadType, path, "", "must be %s", sch.kind)
		return w.skip(tok)
	case nil:
		// null is the zero value of a field; object fields only (checked
		// by the callers for elements and map values).
		return nil
	case string:
		if sch.kind != kindString {
			w.ps.add(CodeBadType, path, "", "must be %s, not a string", sch.kind)
		}
	case json.Number:
		switch sch.kind {
		case kindInt:
			if _, err := strconv.ParseInt(string(t), 10, 64); err != nil {
				w.ps.add(CodeBadType, path, "", "must be an integer, got %s", t)
			}
		case kindNumber:
			f, err := strconv.ParseFloat(string(t), 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				w.ps.add(CodeBadType, path, "", "must be a finite number, got %s", t)
			}
		default:
			w.ps.add(CodeBadType, path, "", "must be %s, not a number%s", sch.kind, quoteHint(sch))
		}
	case bool:
		if sch.kind != kindBool {
			w.ps.add(CodeBadType, path, "", "must be %s, not a boolean%s", sch.kind, quoteHint(sch))
		}
	}
	return nil
}

func quoteHint(sch *schema) string {
	if sch.kind == kindString {
		return " (quote it)"
	}
	return ""
}

func (k kind) String() string {
	switch k {
	case kindString:
		return "a string"
	case kindInt:
		return "an integer"
	case kindNumber:
		return "a number"
	case kindObject:
		return "an object"
	case kindArray:
		return "a list"
	case kindStringMap:
		return "an object of strings"
	case kindRaw:
		return "a value"
	case kindBool:
		return "a boolean"
	}
	return "?"
}

func (w *walker) object(sch *schema, path string) error {
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		fpath := joinField(path, key)
		w.last = fpath
		var fsch *schema
		switch {
		case seen[key]:
			w.ps.add(CodeDuplicateKey, fpath, "", "the field %q appears twice", key)
		case sch.fields[key] == nil:
			w.ps.add(CodeUnknownField, fpath, "", "unknown field %q%s", key, suggest(key, sch.fields))
		default:
			fsch = sch.fields[key]
		}
		seen[key] = true
		if err := w.value(fsch, fpath); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // '}'
	return err
}

func (w *walker) stringMap(path string) error {
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		kpath := path + "[" + strconv.Quote(key) + "]"
		w.last = kpath
		if seen[key] {
			w.ps.add(CodeDuplicateKey, kpath, "", "the key %q appears twice", key)
		}
		seen[key] = true
		if err := w.element(stringSchema, kpath); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // '}'
	return err
}

func (w *walker) array(elem *schema, path string) error {
	for i := 0; w.dec.More(); i++ {
		if err := w.element(elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // ']'
	return err
}

// element walks a list element or map value, where null is refused.
func (w *walker) element(sch *schema, path string) error {
	w.last = path
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		w.ps.add(CodeBadType, path, "", "must be %s, not null", sch.kind)
		return nil
	}
	return w.valueFrom(tok, sch, path)
}

// skip consumes the rest of a value whose first token is tok.
func (w *walker) skip(tok json.Token) error {
	d, ok := tok.(json.Delim)
	if !ok || d == '}' || d == ']' {
		return nil
	}
	for depth := 1; depth > 0; {
		t, err := w.dec.Token()
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			default:
				depth--
			}
		}
	}
	return nil
}

func joinField(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// suggest names a known field that key differs from only in case.
func suggest(key string, fields map[string]*schema) string {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return fmt.Sprintf(" (field names are case-sensitive: did you mean %q?)", name)
		}
	}
	return ""
}
