package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ParseYAML decodes a plan from YAML with the same field names and the same
// strict checks as ParseJSON: the single YAML document is converted to JSON
// and decoded like a JSON plan. Besides, it refuses aliases, merge keys,
// custom tags, binary values, .inf and .nan, and a second document.
// Timestamps (2026-01-31) are kept as the strings they were written as;
// numbers stay numbers, so a number where a string is expected
// (planVersion: 1.0) is refused: quote it.
func ParseYAML(data []byte) (*Plan, error) {
	if err := checkDocument(data); err != nil {
		return nil, err
	}
	js, err := yamlToJSON(trimBOM(data))
	if err != nil {
		return nil, err
	}
	var p Plan
	if err := decodeStrict(js, planSchema, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func yamlToJSON(data []byte) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, docError(CodeSyntax, "", "the document is empty")
		}
		return nil, docError(CodeSyntax, "", "YAML: %s", err.Error())
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, docError(CodeSyntax, "", "the plan must be a single YAML document")
	}
	var b bytes.Buffer
	if err := writeYAMLNode(&b, &doc, ""); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeYAMLNode writes n as JSON. path is the JSON path of n, for errors.
func writeYAMLNode(b *bytes.Buffer, n *yaml.Node, path string) error {
	at := func(format string, args ...any) error {
		return docError(CodeSyntax, path, "YAML line %d: %s", n.Line, fmt.Sprintf(format, args...))
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return docError(CodeSyntax, "", "the document is empty")
		}
		return writeYAMLNode(b, n.Content[0], path)
	case yaml.AliasNode:
		return at("aliases (*%s) are not allowed", n.Value)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return at("mapping keys must be plain scalars")
			}
			switch k.ShortTag() {
			case "!!merge":
				return at("merge keys (<<) are not allowed")
			case "!!null", "!!binary":
				return at("a %s mapping key is not allowed", k.ShortTag())
			}
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(b, k.Value)
			b.WriteByte(':')
			if err := writeYAMLNode(b, v, joinField(path, k.Value)); err != nil {
				return err
			}
		}
		b.WriteByte('}')
		return nil
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, e := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeYAMLNode(b, e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		b.WriteByte(']')
		return nil
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!str", "!!timestamp":
			writeJSONString(b, n.Value)
		case "!!null":
			b.WriteString("null")
		case "!!bool":
			v, err := strconv.ParseBool(strings.ToLower(n.Value))
			if err != nil {
				return at("%q is not a boolean", n.Value)
			}
			b.WriteString(strconv.FormatBool(v))
		case "!!int":
			v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
			if err != nil {
				return at("%q is not an integer in the 64-bit range", n.Value)
			}
			b.WriteString(strconv.FormatInt(v, 10))
		case "!!float":
			v, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
			if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
				return at("%q is not a finite number", n.Value)
			}
			b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		default:
			return at("the tag %s is not allowed", tag)
		}
		return nil
	}
	return at("unexpected YAML node")
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always encodes
	b.Write(enc)
}
