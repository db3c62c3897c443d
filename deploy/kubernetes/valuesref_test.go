package kubernetes

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
)

// The lines of docs/helm.md between which the values reference goes.
const (
	refBegin = "<!-- values reference: generated from values.schema.json by deploy/helm/generate.sh -->"
	refEnd   = "<!-- end of values reference -->"
)

// schemaNode is the part of a JSON Schema the reference reads.
type schemaNode struct {
	Description string                 `json:"description"`
	Type        any                    `json:"type"`
	Enum        []any                  `json:"enum"`
	Pattern     string                 `json:"pattern"`
	Minimum     *float64               `json:"minimum"`
	Maximum     *float64               `json:"maximum"`
	Properties  map[string]*schemaNode `json:"properties"`
}

// valuesReference is a Markdown table of every value the schema
// describes, in the order of values.yaml, with its type, default and
// description. A value without a description is an error: the reference
// would say nothing about it.
func valuesReference(schemaPath, valuesPath string) (string, error) {
	b, err := os.ReadFile(schemaPath)
	if err != nil {
		return "", err
	}
	var root schemaNode
	if err := json.Unmarshal(b, &root); err != nil {
		return "", fmt.Errorf("%s: %w", schemaPath, err)
	}
	vb, err := os.ReadFile(valuesPath)
	if err != nil {
		return "", err
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(vb, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", valuesPath, err)
	}
	if len(doc.Content) != 1 {
		return "", fmt.Errorf("%s: want one YAML document", valuesPath)
	}
	var sb strings.Builder
	sb.WriteString("| value | type | default | description |\n| --- | --- | --- | --- |\n")
	if err := writeRows(&sb, "", &root, doc.Content[0]); err != nil {
		return "", err
	}
	return sb.String(), nil
}

// writeRows writes a row per leaf under node: the keys of values (a
// mapping node, or nil) first and in its order, then the schema's others
// sorted.
func writeRows(sb *strings.Builder, prefix string, node *schemaNode, values *yamlv3.Node) error {
	var order []string
	byKey := map[string]*yamlv3.Node{}
	if values != nil && values.Kind == yamlv3.MappingNode {
		for i := 0; i+1 < len(values.Content); i += 2 {
			k := values.Content[i].Value
			if _, ok := node.Properties[k]; !ok {
				return fmt.Errorf("values.yaml: %s%s is not in the schema", prefix, k)
			}
			order = append(order, k)
			byKey[k] = values.Content[i+1]
		}
	}
	var rest []string
	for k := range node.Properties {
		if _, ok := byKey[k]; !ok {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range append(order, rest...) {
		child, path := node.Properties[k], prefix+k
		if child.Description == "" {
			return fmt.Errorf("values.schema.json: %s has no description", path)
		}
		if len(child.Properties) > 0 {
			if err := writeRows(sb, path+".", child, byKey[k]); err != nil {
				return err
			}
			continue
		}
		def := ""
		if v := byKey[k]; v != nil {
			var x any
			if err := v.Decode(&x); err != nil {
				return fmt.Errorf("values.yaml: %s: %w", path, err)
			}
			j, err := json.Marshal(x)
			if err != nil {
				return fmt.Errorf("values.yaml: %s: %w", path, err)
			}
			def = "`" + string(j) + "`"
		}
		fmt.Fprintf(sb, "| `%s` | %s | %s | %s |\n", path, schemaType(child), def, cell(child.Description))
	}
	return nil
}

// schemaType is a node's type and its limits, as the reference shows them.
func schemaType(n *schemaNode) string {
	var t string
	switch v := n.Type.(type) {
	case string:
		t = v
	case []any:
		var parts []string
		for _, p := range v {
			parts = append(parts, fmt.Sprint(p))
		}
		t = strings.Join(parts, " or ")
	}
	switch {
	case len(n.Enum) > 0:
		var parts []string
		for _, e := range n.Enum {
			parts = append(parts, fmt.Sprint(e))
		}
		t += ": " + strings.Join(parts, ", ")
	case n.Minimum != nil && n.Maximum != nil:
		t += fmt.Sprintf(" %g–%g", *n.Minimum, *n.Maximum)
	case n.Minimum != nil:
		t += fmt.Sprintf(" ≥ %g", *n.Minimum)
	}
	return t
}

// cell escapes a table cell's pipes.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
