package plan

import (
	"fmt"
	"testing"
)

// densePlan is n noop steps, each depending on every step before it: the
// most dependencies a plan of n steps can have (n(n-1)/2).
func densePlan(n int) *Plan {
	p := &Plan{PlanID: "dense", PlanVersion: "1"}
	for i := range n {
		s := Step{StepID: fmt.Sprintf("s%03d", i), Executor: ExecutorSpec{Type: ExecutorNoop}}
		for j := range i {
			s.DependsOn = append(s.DependsOn, fmt.Sprintf("s%03d", j))
		}
		p.Steps = append(p.Steps, s)
	}
	return p
}

// BenchmarkCompileDense: a start's compile of a plan of 500 steps where
// each depends on all before it (124,750 dependencies), within every
// limit a plan has: its CPU is what one such start costs the API.
func BenchmarkCompileDense(b *testing.B) {
	p := densePlan(500)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(p); err != nil {
			b.Fatal(err)
		}
	}
}
