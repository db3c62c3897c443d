package console

import (
	"fmt"
	"io/fs"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// WCAG 2.2 AA minimum contrast ratios: 1.4.3 for text (the console has
// no large text: its biggest heading is 22px, under 24px), 1.4.11 for
// the parts of a control or a graphic needed to see it (borders, focus
// rings, progress bars, graph edges).
const (
	aaText = 4.5
	aaUI   = 3.0
)

// sheet is console.css: each selector's declarations (a rule with a
// selector list gives each selector its declarations; later rules win)
// and the custom properties of :root.
type sheet struct {
	rules map[string]map[string]string
	vars  map[string]string
}

var (
	cssComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	cssRule    = regexp.MustCompile(`([^{}]+)\{([^{}]*)\}`) // innermost rules: an @media's too
	cssVar     = regexp.MustCompile(`var\((--[a-z0-9-]+)\)`)
	cssHex     = regexp.MustCompile(`#(?:[0-9a-fA-F]{6}|[0-9a-fA-F]{3})\b`)
)

func parseSheet(t *testing.T) *sheet {
	t.Helper()
	b, err := fs.ReadFile(Assets(), "assets/console.css")
	if err != nil {
		t.Fatal(err)
	}
	css := cssComment.ReplaceAllString(string(b), "")
	s := &sheet{rules: map[string]map[string]string{}, vars: map[string]string{}}
	for _, m := range cssRule.FindAllStringSubmatch(css, -1) {
		decls := map[string]string{}
		for _, d := range strings.Split(m[2], ";") {
			prop, val, ok := strings.Cut(d, ":")
			if ok {
				decls[strings.TrimSpace(prop)] = strings.TrimSpace(val)
			}
		}
		for _, sel := range strings.Split(m[1], ",") {
			sel = strings.Join(strings.Fields(sel), " ")
			if sel == ":root" {
				for p, v := range decls {
					if strings.HasPrefix(p, "--") {
						s.vars[p] = v
					}
				}
			}
			if s.rules[sel] == nil {
				s.rules[sel] = map[string]string{}
			}
			for p, v := range decls {
				s.rules[sel][p] = v
			}
		}
	}
	return s
}

// colour is the colour a declaration sets ("" for none, such as
// transparent), its var()s resolved.
func (s *sheet) colour(t *testing.T, sel, prop string) string {
	t.Helper()
	decls, ok := s.rules[sel]
	if !ok {
		t.Fatalf("console.css has no rule %q", sel)
	}
	v, ok := decls[prop]
	if !ok {
		t.Fatalf("console.css: %s sets no %s", sel, prop)
	}
	return s.resolve(t, v)
}

func (s *sheet) resolve(t *testing.T, v string) string {
	t.Helper()
	for range 5 {
		v = cssVar.ReplaceAllStringFunc(v, func(ref string) string {
			name := cssVar.FindStringSubmatch(ref)[1]
			val, ok := s.vars[name]
			if !ok {
				t.Fatalf("console.css: %s is not defined", name)
			}
			return val
		})
	}
	return cssHex.FindString(v)
}

// luminance is a colour's relative luminance (WCAG 2.2, sRGB).
func luminance(hex string) float64 {
	h := strings.TrimPrefix(hex, "#")
	if len(h) == 3 {
		h = string([]byte{h[0], h[0], h[1], h[1], h[2], h[2]})
	}
	var lin [3]float64
	for i := range lin {
		n, _ := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		c := float64(n) / 255
		if c <= 0.04045 {
			lin[i] = c / 12.92
		} else {
			lin[i] = math.Pow((c+0.055)/1.055, 2.4)
		}
	}
	return 0.2126*lin[0] + 0.7152*lin[1] + 0.0722*lin[2]
}

func contrast(a, b string) float64 {
	la, lb := luminance(a), luminance(b)
	return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)
}

// ref is a colour of the stylesheet: a selector's property.
type ref struct{ sel, prop string }

func (r ref) String() string { return r.sel + " " + r.prop }

// pair is a foreground drawn on a background where the page puts it.
type pair struct {
	what   string
	fg, bg ref
	min    float64
}

var (
	fgText = ref{"body", "color"}
	page   = ref{"body", "background"}
	panel  = ref{"form.filters", "background"} // .panel, details.action: var(--panel)
)

// inheritedPairs are the pairs whose text or part takes its colour or
// its background from an enclosing rule; a rule that sets both colour
// and background is a pair by itself (TestContrast_WCAG_AA).
var inheritedPairs = []pair{
	{"text on the page", fgText, page, aaText},
	{"a link", ref{"a", "color"}, page, aaText},
	{"a link in a panel", ref{"a", "color"}, panel, aaText},
	{"muted text", ref{".muted", "color"}, page, aaText},
	{"muted text in a panel", ref{".muted", "color"}, panel, aaText},
	{"a field's label", ref{"label", "color"}, panel, aaText},
	{"a checkbox's label", ref{"label.inline", "color"}, panel, aaText},
	{"a term of a run's details", ref{".kv dt", "color"}, page, aaText},
	{"text in a panel", fgText, ref{".panel", "background"}, aaText},
	{"an action's form", fgText, ref{"details.action", "background"}, aaText},
	{"a table header", fgText, ref{"th", "background"}, aaText},
	{"a row just changed", fgText, ref{"tr.flash td", "background"}, aaText},
	{"muted text in a row just changed", ref{".muted", "color"}, ref{"tr.flash td", "background"}, aaText},
	{"a link in a row just changed", ref{"a", "color"}, ref{"tr.flash td", "background"}, aaText},
	{"a command to copy", fgText, ref{".cmd code", "background"}, aaText},
	{"the skip link", fgText, ref{".skip:focus", "background"}, aaText},
	{"the page in the top bar", ref{".top a", "color"}, ref{".top a[aria-current=\"page\"]", "background"}, aaText},
	{"a link in the top bar", ref{".top a", "color"}, ref{".top", "background"}, aaText},
	{"sign out in the top bar", ref{".top button.quiet", "color"}, ref{".top", "background"}, aaText},
	{"a danger button", ref{"button", "color"}, ref{"button.danger", "background"}, aaText},
	{"an error toast", ref{".toast > div", "color"}, ref{".toast > div.error", "background"}, aaText},
	{"a step of the graph", ref{"svg.graph text", "fill"}, ref{"svg.graph rect", "fill"}, aaText},
	{"a step that succeeded", ref{"svg.graph text", "fill"}, ref{"svg.graph g.SUCCESS rect", "fill"}, aaText},
	{"a step running", ref{"svg.graph text", "fill"}, ref{"svg.graph g.RUNNING rect", "fill"}, aaText},
	{"a step that failed", ref{"svg.graph text", "fill"}, ref{"svg.graph g.FAILED rect", "fill"}, aaText},
	{"a step pending", ref{"svg.graph text", "fill"}, ref{"svg.graph g.PENDING rect", "fill"}, aaText},
	{"a step skipped", ref{"svg.graph text", "fill"}, ref{"svg.graph g.SKIPPED rect", "fill"}, aaText},

	{"the focus ring", ref{":focus-visible", "outline"}, page, aaUI},
	{"the focus ring in a panel", ref{":focus-visible", "outline"}, panel, aaUI},
	{"the focus ring in the top bar", ref{".top a:focus-visible", "outline-color"}, ref{".top", "background"}, aaUI},
	{"the focus ring on sign out", ref{".top button:focus-visible", "outline-color"}, ref{".top", "background"}, aaUI},
	{"a focused step", ref{"svg.graph g:focus rect", "stroke"}, ref{".graph-wrap", "background"}, aaUI},
	{"a field's border", ref{"input", "border"}, page, aaUI},
	{"a field's border in a panel", ref{"input", "border"}, panel, aaUI},
	{"a button", ref{"button", "background"}, page, aaUI},
	{"a button in a panel", ref{"button", "background"}, panel, aaUI},
	{"a quiet button's border", ref{"button", "border"}, page, aaUI},
	{"sign out's border", ref{".top button.quiet", "border-color"}, ref{".top", "background"}, aaUI},
	{"a drain's progress", ref{".bar > span", "background"}, ref{".bar", "background"}, aaUI},
	{"a drain done", ref{".bar.done > span", "background"}, ref{".bar", "background"}, aaUI},
	{"a graph edge", ref{"svg.graph .edge", "stroke"}, ref{".graph-wrap", "background"}, aaUI},
	{"a step's box", ref{"svg.graph rect", "stroke"}, ref{".graph-wrap", "background"}, aaUI},
	{"a succeeded step's box", ref{"svg.graph g.SUCCESS rect", "stroke"}, ref{".graph-wrap", "background"}, aaUI},
	{"a running step's box", ref{"svg.graph g.RUNNING rect", "stroke"}, ref{".graph-wrap", "background"}, aaUI},
	{"a failed step's box", ref{"svg.graph g.FAILED rect", "stroke"}, ref{".graph-wrap", "background"}, aaUI},
}

// checkedProps are the properties whose every colour must be in a pair.
// Borders and lines not listed in a pair are decoration (table rules,
// panel edges), which WCAG does not ask to contrast.
var checkedProps = []string{"color", "background", "background-color", "fill", "stroke", "outline", "outline-color"}

// TestContrast_WCAG_AA: every text colour of console.css is at least
// 4.5:1 against the background the page draws it on, and every focus
// ring, field border, progress bar and graph line at least 3:1 (WCAG 2.2
// AA). A rule that sets a colour and a background is a pair; the others
// are in inheritedPairs, and a colour of the sheet in no pair fails the
// test, so a new colour is checked too.
func TestContrast_WCAG_AA(t *testing.T) {
	s := parseSheet(t)
	pairs := append([]pair{}, inheritedPairs...)
	for sel, decls := range s.rules {
		bgProp := "background"
		if _, ok := decls[bgProp]; !ok {
			bgProp = "background-color"
		}
		if _, ok := decls["color"]; ok {
			if _, ok := decls[bgProp]; ok && s.resolve(t, decls[bgProp]) != "" {
				pairs = append(pairs, pair{sel, ref{sel, "color"}, ref{sel, bgProp}, aaText})
			}
		}
	}
	covered := map[ref]bool{}
	for _, p := range pairs {
		fg, bg := s.colour(t, p.fg.sel, p.fg.prop), s.colour(t, p.bg.sel, p.bg.prop)
		covered[p.fg], covered[p.bg] = true, true
		if fg == "" || bg == "" {
			t.Errorf("%s: %s (%q) on %s (%q): a colour is missing", p.what, p.fg, fg, p.bg, bg)
			continue
		}
		if r := contrast(fg, bg); r < p.min {
			t.Errorf("%s: %s %s on %s %s is %.2f:1, want at least %.1f:1", p.what, p.fg, fg, p.bg, bg, r, p.min)
		}
	}
	for sel, decls := range s.rules {
		for _, prop := range checkedProps {
			if v, ok := decls[prop]; ok && s.resolve(t, v) != "" && !covered[ref{sel, prop}] {
				t.Errorf("%s %s: %s: a colour in no checked pair (add it to inheritedPairs)", sel, prop, v)
			}
		}
	}
}

// TestContrast_EveryStatusHasItsColours: each run status, the DRAINING
// substatus and each step status has a badge rule, and each step status
// a box in the step graph, so no state is drawn in the unchecked
// defaults.
func TestContrast_EveryStatusHasItsColours(t *testing.T) {
	s := parseSheet(t)
	runs := []string{statestore.RunStatusPending, statestore.RunStatusQueued, statestore.RunStatusApproved, statestore.RunStatusRunning,
		statestore.RunStatusPaused, statestore.RunStatusCompleted, statestore.RunStatusFailed, statestore.RunStatusCancelled,
		statestore.SubstatusDraining}
	steps := []string{statestore.StepStatusPending, statestore.StepStatusRunning, statestore.StepStatusSuccess,
		statestore.StepStatusFailed, statestore.StepStatusSkipped}
	for _, st := range append(runs, steps...) {
		if _, ok := s.rules[".s-"+st]; !ok {
			t.Errorf("no badge rule .s-%s", st)
		}
	}
	for _, st := range steps {
		if _, ok := s.rules[fmt.Sprintf("svg.graph g.%s rect", st)]; !ok {
			t.Errorf("no step graph rule svg.graph g.%s rect", st)
		}
	}
}

// TestContrast_Ratio: the ratio of WCAG's definition, at its known
// points (#777 on white is the classic just-fails-AA grey).
func TestContrast_Ratio(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want float64
	}{{"#000", "#fff", 21}, {"#fff", "#fff", 1}, {"#777777", "#ffffff", 4.48}, {"#767676", "#fff", 4.54}} {
		if got := contrast(c.a, c.b); math.Abs(got-c.want) > 0.01 {
			t.Errorf("contrast(%s, %s) = %.3f, want %.2f", c.a, c.b, got, c.want)
		}
	}
}
