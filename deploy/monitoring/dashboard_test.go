package monitoring_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestDashboard_Importable checks what Grafana 10+ needs to import the
// dashboard on any instance: schemaVersion 38 or later, the data source
// as a variable of type prometheus, and every panel and target using that
// variable rather than a data source uid of one installation.
func TestDashboard_Importable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/sidecar-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["id"]; ok {
		t.Error("the dashboard has an id: leave it out so that import creates one")
	}
	d := loadDashboard(t)
	if d.SchemaVersion < 38 {
		t.Errorf("schemaVersion %d, want 38 or later (Grafana 10)", d.SchemaVersion)
	}
	foundDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" {
			var q string
			_ = json.Unmarshal(v.Query, &q)
			foundDS = v.Type == "datasource" && q == "prometheus"
		}
	}
	if !foundDS {
		t.Error(`no template variable "datasource" of type datasource, query prometheus`)
	}
	wantDS := `{"type":"prometheus","uid":"${datasource}"}`
	ids := map[float64]bool{}
	for _, p := range raw["panels"].([]any) {
		pm := p.(map[string]any)
		id, _ := pm["id"].(float64)
		if ids[id] {
			t.Errorf("panel id %v used twice", id)
		}
		ids[id] = true
	}
	for _, p := range allPanels(d.Panels) {
		if p.Type == "row" {
			continue
		}
		if got := compact(t, p.Datasource); got != wantDS {
			t.Errorf("panel %q: datasource %s, want %s", p.Title, got, wantDS)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			if got := compact(t, tg.Datasource); got != wantDS {
				t.Errorf("panel %q %s: datasource %s, want %s", p.Title, tg.RefID, got, wantDS)
			}
			if tg.Expr == "" {
				t.Errorf("panel %q %s: empty expr", p.Title, tg.RefID)
			}
		}
	}
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestDashboard_MetricNames checks, without any server, that every metric
// the dashboard and the alert rules query is one the sidecar's code
// registers (a Name: "sidecar_..." or a prometheus.NewDesc("sidecar_...")
// in a Go file outside deploy/). The live
// test checks the same against real data; this one runs everywhere.
func TestDashboard_MetricNames(t *testing.T) {
	defined := registeredMetrics(t)
	used := map[string][]string{}
	name := regexp.MustCompile(`\bsidecar_[a-z0-9_]+`)
	note := func(where, expr string) {
		for _, m := range name.FindAllString(expr, -1) {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base, ok := strings.CutSuffix(m, suffix); ok && defined[base] {
					m = base
				}
			}
			used[m] = append(used[m], where)
		}
	}
	for _, p := range allPanels(loadDashboard(t).Panels) {
		for _, tg := range p.Targets {
			note("panel "+p.Title, tg.Expr)
		}
	}
	for _, r := range loadAlertRules(t) {
		note("alert "+r.Alert, r.Expr)
	}
	var missing []string
	for m, where := range used {
		if !defined[m] {
			missing = append(missing, m+" ("+strings.Join(where, ", ")+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not a metric the sidecar registers: %s", m)
	}
	if len(used) < 25 {
		t.Errorf("only %d metrics found in the dashboard and rules", len(used))
	}
}

func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?:Name:\s*|prometheus\.NewDesc\()"(sidecar_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "deploy" || d.Name() == ".git" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 20 {
		t.Fatalf("found only %d registered metrics under %s", len(out), repoRoot)
	}
	return out
}

// TestDashboard_Layout: each panel sits under the row of its subject (a
// panel belongs to the last row above it); "Draining runs" is not red at
// its first draining run (draining is what a pause does); the overview
// shows which sidecars are up and the versions they run.
func TestDashboard_Layout(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/sidecar-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type, Title string
			GridPos     struct{ X, Y int } `json:"gridPos"`
			FieldConfig struct {
				Defaults struct {
					Thresholds struct {
						Steps []struct {
							Color string
							Value *float64
						}
					}
				}
			} `json:"fieldConfig"`
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	rowOf := map[string]string{}
	row := ""
	lastY := -1
	for _, p := range d.Panels {
		if p.GridPos.Y < lastY {
			t.Errorf("panel %q (y %d) comes after a panel at y %d: keep panels in layout order", p.Title, p.GridPos.Y, lastY)
		}
		lastY = p.GridPos.Y
		if p.Type == "row" {
			row = p.Title
			continue
		}
		rowOf[p.Title] = row
	}
	for title, want := range map[string]string{
		"Paused runs by origin": "Pause and drain", "Paused runs by reason": "Pause and drain", "Drain ETA of the slowest open drain": "Pause and drain",
		"Replicas and their share of the runs": "Replicas and run list", "Run list": "Replicas and run list",
		"Event bus: delivered and dead-lettered": "Event bus", "Event bus: lag and delivery latency": "Event bus",
		"Admission: queue depth and wait": "Admission", "Admission: decisions": "Admission",
		"Control API requests": "Conductor and API", "Sidecars up": "Overview", "Versions": "Overview",
	} {
		if got, ok := rowOf[title]; !ok || got != want {
			t.Errorf("panel %q under row %q, want %q", title, got, want)
		}
	}
	var up, version bool
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			up = up || strings.Contains(tg.Expr, "up{")
			version = version || strings.Contains(tg.Expr, "sidecar_build_info")
		}
		if p.Title != "Draining runs" {
			continue
		}
		for _, s := range p.FieldConfig.Defaults.Thresholds.Steps {
			if s.Value != nil && *s.Value <= 1 && s.Color == "red" {
				t.Errorf("Draining runs turns red at %v: a drain is normal operation", *s.Value)
			}
		}
	}
	if !up || !version {
		t.Errorf("no panel shows up (%v) and the versions (sidecar_build_info: %v)", up, version)
	}
}

// TestMetrics_Documented: every metric the sidecar registers is named in
// the operator docs (docs/*.md), so that an operator who scrapes one can
// find what it means.
func TestMetrics_Documented(t *testing.T) {
	var docs strings.Builder
	paths, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	var missing []string
	for m := range registeredMetrics(t) {
		if !strings.Contains(docs.String(), m) {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("metrics named nowhere in docs/: %v", missing)
	}
}
