package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/node"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// busConfig is the event bus's sinks (--bus-sink, repeated) and its retry
// budget.
type busConfig struct {
	Sinks       []sinkSpec
	MaxAttempts int
	// unparsed are the problems of --bus-sink values that did not parse,
	// reported by validate: Set does not fail, since the flag package
	// would print the value, whose URL may carry a credential.
	unparsed []string
}

// sinkSpec is one --bus-sink: KIND:key=value,key=value.
//
//	nats:prefix=acme[,name=ops][,vocabulary=sidecar|core|noetl][,max-age=168h]
//	webhook:url=https://...,secret-file=/path[,name=audit][,vocabulary=...][,timeout=10s]
type sinkSpec struct {
	Kind   string
	Params map[string]string
}

func (s sinkSpec) name() string {
	if n := s.Params["name"]; n != "" {
		return n
	}
	return s.Kind
}

type sinksValue struct{ c *busConfig }

func (v *sinksValue) String() string {
	if v.c == nil {
		return ""
	}
	var out []string
	for _, s := range v.c.Sinks {
		out = append(out, s.Kind+":"+s.Params["name"])
	}
	return strings.Join(out, ";")
}

var sinkKeys = map[string][]string{
	"nats":    {"name", "vocabulary", "prefix", "max-age"},
	"webhook": {"name", "vocabulary", "url", "secret-file", "timeout"},
}

// Set parses one sink; several may be given at once separated by ';'
// (the environment variable's form).
func (v *sinksValue) Set(text string) error {
	for _, one := range strings.Split(text, ";") {
		if one = strings.TrimSpace(one); one == "" {
			continue
		}
		if s, problem := parseSink(one); problem != "" {
			v.c.unparsed = append(v.c.unparsed, fmt.Sprintf("--bus-sink %s (the %s given): %s: %s", sinkKind(one), ordinal(len(v.c.Sinks)+len(v.c.unparsed)+1), eventbus.CodeSinkInvalid, problem))
		} else {
			v.c.Sinks = append(v.c.Sinks, s)
		}
	}
	return nil
}

// parseSink parses KIND:key=value,...; a problem names keys, never a
// value (a URL may carry a credential).
func parseSink(one string) (sinkSpec, string) {
	kind, rest, _ := strings.Cut(one, ":")
	keys, ok := sinkKeys[kind]
	if !ok {
		return sinkSpec{}, "the kind is nats or webhook, e.g. nats:prefix=acme or webhook:url=https://hooks.example/sidecar,secret-file=/etc/sidecar/hook.key"
	}
	s := sinkSpec{Kind: kind, Params: map[string]string{}}
	for _, kv := range strings.Split(rest, ",") {
		if kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return sinkSpec{}, "a part without \"=\" (settings are key=value separated by commas, and a value cannot hold a comma)"
		case !slices.Contains(keys, k):
			return sinkSpec{}, fmt.Sprintf("%q is not a %s sink setting (%s)", k, kind, strings.Join(keys, ", "))
		}
		if _, twice := s.Params[k]; twice {
			return sinkSpec{}, fmt.Sprintf("%s= is given twice", k)
		}
		s.Params[k] = val
	}
	return s, ""
}

// sinkKind is the kind of a sink value, for a problem's line ("" unless
// it is one).
func sinkKind(one string) string {
	if kind, _, _ := strings.Cut(one, ":"); sinkKeys[kind] != nil {
		return kind
	}
	return "value"
}

// ordinal is n in words up to ten (first, second, ...), else "#n".
func ordinal(n int) string {
	if w := []string{"first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"}; n >= 1 && n <= len(w) {
		return w[n-1]
	}
	return fmt.Sprintf("#%d", n)
}

func (c *busConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	fs.Var(&sinksValue{c}, "bus-sink", "an event bus sink, repeatable: nats:prefix=P[,name=N][,vocabulary=sidecar|core|noetl][,max-age=D] or webhook:url=U,secret-file=F[,name=N][,vocabulary=...][,timeout=D] (env "+envName("bus-sink")+", ';' between sinks)")
	before := len(c.unparsed)
	env.set(fs, "bus-sink")
	for i := before; i < len(c.unparsed); i++ { // from the environment: named as it was given
		c.unparsed[i] = envName("bus-sink") + strings.TrimPrefix(c.unparsed[i], "--bus-sink")
	}
	fs.Var(&intValue{&c.MaxAttempts}, "bus-max-attempts", "delivery attempts of an event before it is dead-lettered (env "+envName("bus-max-attempts")+")")
	if v, ok := os.LookupEnv(envName("bus-max-attempts")); ok {
		if fs.Set("bus-max-attempts", v) != nil {
			c.MaxAttempts = -1 // validate names it
		}
	}
}

// validate returns the problems of the bus settings (files are read when
// the sinks are opened).
func (c *busConfig) validate() []string {
	p := slices.Clone(c.unparsed)
	if c.MaxAttempts < 1 {
		p = append(p, "--bus-max-attempts must be >= 1")
	}
	seen := map[string]bool{}
	for _, s := range c.Sinks {
		n := s.name()
		if seen[n] {
			p = append(p, fmt.Sprintf("--bus-sink: two sinks named %q (give one name=)", n))
		}
		seen[n] = true
		if err := eventbus.CheckSinkName(n); err != nil {
			p = append(p, fmt.Sprintf("--bus-sink: %v", err))
		}
		if v := s.Params["vocabulary"]; v != "" && v != vocab.Sidecar && v != vocab.Core && v != vocab.NoETL {
			p = append(p, fmt.Sprintf("--bus-sink %s: vocabulary=%q: sidecar, core or noetl", n, v))
		}
		switch s.Kind {
		case "nats":
			if err := eventbus.CheckPrefix(s.Params["prefix"]); err != nil {
				p = append(p, fmt.Sprintf("--bus-sink %s: %v", n, err))
			}
			if v := s.Params["max-age"]; v != "" {
				if d, err := time.ParseDuration(v); err != nil || d <= 0 {
					p = append(p, fmt.Sprintf("--bus-sink %s: max-age=%q: a positive duration like 168h", n, v))
				}
			}
		case "webhook":
			if s.Params["url"] == "" || s.Params["secret-file"] == "" {
				p = append(p, fmt.Sprintf("--bus-sink %s: url= and secret-file= are required (the secret signs every request)", n))
			} else if u, err := url.Parse(s.Params["url"]); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				// The URL is not shown: it may carry a credential.
				p = append(p, fmt.Sprintf("--bus-sink %s: url= must be an http(s) URL with a host, like https://hooks.example/sidecar", n))
			}
			if f := s.Params["secret-file"]; f != "" {
				if secret, err := readSecret(f); err != nil {
					p = append(p, fmt.Sprintf("--bus-sink %s: %s: %v", n, eventbus.CodeSinkInvalid, err))
				} else if len(secret) < eventbus.MinSecretBytes {
					p = append(p, fmt.Sprintf("--bus-sink %s: %s: the signing secret in %s is %d bytes, at least %d are needed", n, eventbus.CodeSinkInvalid, f, len(secret), eventbus.MinSecretBytes))
				}
			}
			if v := s.Params["timeout"]; v != "" {
				if d, err := time.ParseDuration(v); err != nil || d <= 0 {
					p = append(p, fmt.Sprintf("--bus-sink %s: timeout=%q: a positive duration like 10s", n, v))
				}
			}
		}
	}
	return p
}

// node is the bus as the node opens it. A webhook's secret file holds the
// key: its raw bytes, or "whsec_" and the key in base64 (the Standard
// Webhooks form).
func (c *busConfig) node() (node.Bus, error) {
	b := node.Bus{MaxAttempts: c.MaxAttempts}
	for _, s := range c.Sinks {
		switch s.Kind {
		case "nats":
			age, _ := time.ParseDuration(s.Params["max-age"])
			b.Sinks = append(b.Sinks, node.Sink{NATS: &eventbus.NATSSinkConfig{Name: s.name(), Vocabulary: s.Params["vocabulary"],
				Prefix: s.Params["prefix"], MaxAge: age}})
		case "webhook":
			secret, err := readSecret(s.Params["secret-file"])
			if err != nil {
				return b, fmt.Errorf("--bus-sink %s: %w", s.name(), err)
			}
			timeout, _ := time.ParseDuration(s.Params["timeout"])
			b.Sinks = append(b.Sinks, node.Sink{Webhook: &eventbus.WebhookSinkConfig{Name: s.name(), Vocabulary: s.Params["vocabulary"],
				URL: s.Params["url"], Secret: secret, Timeout: timeout}})
		}
	}
	return b, nil
}

func readSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the signing secret: %w", err)
	}
	text := strings.TrimSpace(string(b))
	if k, ok := strings.CutPrefix(text, "whsec_"); ok {
		key, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return nil, fmt.Errorf("secret-file %s: whsec_ followed by something that is not base64: %w", path, err)
		}
		return key, nil
	}
	return []byte(text), nil
}
