package runlist

import (
	"math"
	"testing"
)

// TestEstimate: the remaining time of a step is estimated from the past
// durations longer than what it has run already; too little history is
// unknown.
func TestEstimate(t *testing.T) {
	samples := []float64{6, 2, 5, 3, 4}
	for _, c := range []struct {
		elapsed  float64
		p50, p90 float64
		ok       bool
	}{
		{0, 4, 5.6, true},
		{3.5, 1.5, 2.3, true}, // left: 0.5, 1.5, 2.5
		{5.5, 0.5, 0.5, true}, // only the 6 s run is longer
		{6, 0, 0, false},      // longer than every run seen
	} {
		p50, p90, _, ok := estimate(samples, c.elapsed)
		if ok != c.ok || math.Abs(p50-c.p50) > 1e-9 || math.Abs(p90-c.p90) > 1e-9 {
			t.Errorf("elapsed %v: got %v %v %v, want %v %v %v", c.elapsed, p50, p90, ok, c.p50, c.p90, c.ok)
		}
	}
	if _, _, _, ok := estimate([]float64{1, 2}, 0); ok {
		t.Error("an estimate from two durations")
	}
	d := StepDurations{}
	for i := range MaxDurationSamples + 5 {
		d.add(float64(i))
	}
	if len(d.Seconds) != MaxDurationSamples || d.Seconds[0] != 5 {
		t.Fatalf("kept %d durations from %v, want the latest %d", len(d.Seconds), d.Seconds[0], MaxDurationSamples)
	}
}
