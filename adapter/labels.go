package adapter

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// MaxLabels bounds the labels of one run.
const MaxLabels = 64

// labelName is Kubernetes' label name (and value) syntax: at most 63
// characters, alphanumerics at both ends, '-', '_' and '.' between.
var (
	labelName   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefix = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// LabelProblem is one label that breaks the rules: Key is the label's key,
// Message says which rule.
type LabelProblem struct {
	Key     string
	Message string
}

// CheckLabels checks a run's labels against Kubernetes' rules: a key is
// [prefix/]name, name as labelName, prefix a DNS subdomain of at most 253
// characters; a value is empty or as labelName; at most MaxLabels. It
// returns the problems sorted by key (none: the labels are valid).
func CheckLabels(labels map[string]string) []LabelProblem {
	var out []LabelProblem
	if len(labels) > MaxLabels {
		out = append(out, LabelProblem{Message: fmt.Sprintf("%d labels: at most %d", len(labels), MaxLabels)})
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if msg := checkLabelKey(k); msg != "" {
			out = append(out, LabelProblem{Key: shown(k), Message: msg})
			continue
		}
		if v := labels[k]; v != "" && !labelName.MatchString(v) {
			out = append(out, LabelProblem{Key: shown(k), Message: fmt.Sprintf("value %s: at most 63 characters, letters, digits, '-', '_' or '.', starting and ending with a letter or digit", quoted(v))})
		}
	}
	return out
}

func checkLabelKey(k string) string {
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if len(prefix) > 253 || !labelPrefix.MatchString(prefix) {
			return fmt.Sprintf("key prefix %s: a DNS subdomain (lowercase letters, digits, '-', '.'), at most 253 characters", quoted(prefix))
		}
		name = rest
	}
	if !labelName.MatchString(name) {
		return fmt.Sprintf("key name %s: 1 to 63 characters, letters, digits, '-', '_' or '.', starting and ending with a letter or digit", quoted(name))
	}
	return ""
}

// maxShown is how many bytes of a label's key or value a problem quotes:
// more than any valid one has (317 for a key), so a problem quotes a
// valid-length input whole and only the start of a huge one.
const maxShown = 320

// quoted is s quoted, cut to maxShown bytes (at a rune boundary) with its
// length said when longer: an answer does not send a huge input back.
func quoted(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(strings.ToValidUTF8(s[:maxShown], "")), len(s))
}

// shown is a label key as a problem names it: cut as quoted cuts it.
func shown(k string) string {
	if len(k) <= maxShown {
		return k
	}
	return strings.ToValidUTF8(k[:maxShown], "") + "..."
}
