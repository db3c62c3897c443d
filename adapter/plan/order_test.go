package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// checkCompiledOrder checks that c's workflow runs every step of p exactly
// once and never before all of its dependencies, in two ways:
//
//   - statically, over every interleaving: it computes, for each step task,
//     the set of steps that are certainly complete when Conductor can
//     schedule it (a task in a list follows the one before it; a FORK_JOIN
//     starts every branch; its JOIN, which must follow it and join on the
//     last task of every branch, completes after all of them), and requires
//     every dependency in that set; with exact, it requires the set to be
//     exactly the step's ancestors (no added waiting);
//   - by simulation: rounds runs of the workflow with Conductor's
//     scheduling rules, completing a random ready task at a time, checking
//     each step's dependencies when it starts and that the run completes.
//
// It returns the guaranteed-before sets by stepId.
func checkCompiledOrder(t testing.TB, p *Plan, c *Compiled, exact bool, rounds int, rng *rand.Rand) map[string]map[string]bool {
	t.Helper()
	stepByRef := map[string]*Step{}
	for i := range p.Steps {
		s := &p.Steps[i]
		ref := c.RefByStep[s.StepID]
		if ref == "" || ref != StepRef(s.StepID) {
			t.Fatalf("step %q: ref %q, want %q", s.StepID, ref, StepRef(s.StepID))
		}
		stepByRef[ref] = s
	}
	refs := map[string]bool{}
	before := map[string]map[string]bool{}
	var analyze func(seq []model.WorkflowTask, done map[string]bool, where string) map[string]bool
	analyze = func(seq []model.WorkflowTask, done map[string]bool, where string) map[string]bool {
		done = cloneSet(done)
		for i := 0; i < len(seq); i++ {
			wt := seq[i]
			if refs[wt.TaskReferenceName] {
				t.Fatalf("%s: taskReferenceName %q used twice", where, wt.TaskReferenceName)
			}
			refs[wt.TaskReferenceName] = true
			switch wt.Type_ {
			case "SIMPLE":
				s := stepByRef[wt.TaskReferenceName]
				if s == nil {
					t.Fatalf("%s: SIMPLE task %q is no step of the plan", where, wt.TaskReferenceName)
				}
				if _, twice := before[s.StepID]; twice {
					t.Fatalf("step %q appears twice", s.StepID)
				}
				if wt.Name != TaskType(s.Executor.Type) || wt.TaskDefinition == nil || wt.TaskDefinition.Name != wt.Name {
					t.Fatalf("step %q: task name %q / inline def %+v, want type %q", s.StepID, wt.Name, wt.TaskDefinition, TaskType(s.Executor.Type))
				}
				before[s.StepID] = cloneSet(done)
				done[s.StepID] = true
			case "NOOP":
				// The guard a JOIN waits on instead of a step Conductor
				// may retry: right after such a step, last of a branch.
				if i == 0 || i != len(seq)-1 || !strings.Contains(where, "/") {
					t.Fatalf("%s: NOOP %q is not the end of a fork's branch", where, wt.TaskReferenceName)
				}
				if prev := seq[i-1]; prev.Type_ != "SIMPLE" || prev.TaskDefinition == nil || prev.TaskDefinition.RetryCount == 0 {
					t.Fatalf("%s: NOOP %q follows %q, not a step Conductor may retry", where, wt.TaskReferenceName, prev.TaskReferenceName)
				}
			case "FORK_JOIN":
				if i+1 >= len(seq) || seq[i+1].Type_ != "JOIN" {
					t.Fatalf("%s: FORK_JOIN %q is not followed by a JOIN", where, wt.TaskReferenceName)
				}
				join := seq[i+1]
				if len(wt.ForkTasks) < 2 {
					t.Fatalf("%s: FORK_JOIN %q has %d branches", where, wt.TaskReferenceName, len(wt.ForkTasks))
				}
				var ends []string
				after := cloneSet(done)
				for b, branch := range wt.ForkTasks {
					if len(branch) == 0 {
						t.Fatalf("%s: FORK_JOIN %q has an empty branch", where, wt.TaskReferenceName)
					}
					if last := branch[len(branch)-1]; last.Type_ == "SIMPLE" && last.TaskDefinition != nil && last.TaskDefinition.RetryCount > 0 {
						t.Fatalf("%s: branch %d of %q ends with %q, a step Conductor may retry: its JOIN would see a try's FAILED before the retry (Conductor 3.32)",
							where, b, wt.TaskReferenceName, last.TaskReferenceName)
					}
					ends = append(ends, branch[len(branch)-1].TaskReferenceName)
					for k := range analyze(branch, done, fmt.Sprintf("%s/%s[%d]", where, wt.TaskReferenceName, b)) {
						after[k] = true
					}
				}
				if !slices.Equal(ends, join.JoinOn) {
					t.Fatalf("%s: JOIN %q joins on %v, want the branch ends %v", where, join.TaskReferenceName, join.JoinOn, ends)
				}
				refs[join.TaskReferenceName] = true
				i++
				done = after
			default:
				t.Fatalf("%s: unexpected task type %q (%q)", where, wt.Type_, wt.TaskReferenceName)
			}
		}
		return done
	}
	analyze(c.Workflow.Tasks, map[string]bool{}, "tasks")
	anc := ancestors(p)
	for _, s := range p.Steps {
		got, ok := before[s.StepID]
		if !ok {
			t.Fatalf("step %q is not in the workflow", s.StepID)
		}
		for a := range anc[s.StepID] {
			if !got[a] {
				t.Fatalf("step %q may start before its dependency %q", s.StepID, a)
			}
		}
		if exact && len(got) != len(anc[s.StepID]) {
			t.Fatalf("step %q waits for %v, want only its ancestors %v", s.StepID, keys(got), keys(anc[s.StepID]))
		}
	}
	if len(before) != len(p.Steps) {
		t.Fatalf("workflow has %d steps, plan %d", len(before), len(p.Steps))
	}
	for r := 0; r < rounds; r++ {
		simulate(t, p, c, stepByRef, rng)
	}
	return before
}

// simulate runs the workflow once the way Conductor's decider schedules
// it, completing one random ready task at a time.
func simulate(t testing.TB, p *Plan, c *Compiled, stepByRef map[string]*Step, rng *rand.Rand) {
	t.Helper()
	type cont struct {
		seq  []model.WorkflowTask
		next int
	}
	type readyTask struct {
		ref  string
		then cont
	}
	type joinWait struct {
		ref  string
		on   []string
		then cont
	}
	done := map[string]bool{}
	var ready []readyTask
	var joins []joinWait
	finished := false
	var schedule func(k cont)
	schedule = func(k cont) {
		if k.next >= len(k.seq) {
			if len(k.seq) > 0 && &k.seq[0] == &c.Workflow.Tasks[0] {
				finished = true
			}
			return
		}
		wt := k.seq[k.next]
		switch wt.Type_ {
		case "SIMPLE":
			ready = append(ready, readyTask{wt.TaskReferenceName, cont{k.seq, k.next + 1}})
		case "NOOP":
			// A synchronous system task: done when scheduled.
			done[wt.TaskReferenceName] = true
			schedule(cont{k.seq, k.next + 1})
		case "FORK_JOIN":
			join := k.seq[k.next+1]
			joins = append(joins, joinWait{join.TaskReferenceName, join.JoinOn, cont{k.seq, k.next + 2}})
			for _, b := range wt.ForkTasks {
				schedule(cont{b, 0})
			}
		default:
			t.Fatalf("unexpected task %q of type %q", wt.TaskReferenceName, wt.Type_)
		}
	}
	schedule(cont{c.Workflow.Tasks, 0})
	var order []string
	for len(ready) > 0 {
		i := rng.IntN(len(ready))
		rt := ready[i]
		ready = slices.Delete(ready, i, i+1)
		s := stepByRef[rt.ref]
		for _, d := range s.DependsOn {
			if !done[StepRef(d)] {
				t.Fatalf("simulation: step %q started before its dependency %q (order so far %v)", s.StepID, d, order)
			}
		}
		if done[rt.ref] {
			t.Fatalf("simulation: step %q ran twice", s.StepID)
		}
		order = append(order, s.StepID)
		done[rt.ref] = true
		schedule(rt.then)
		for progress := true; progress; {
			progress = false
			for j := 0; j < len(joins); j++ {
				jw := joins[j]
				if allDone(done, jw.on) {
					joins = slices.Delete(joins, j, j+1)
					done[jw.ref] = true
					schedule(jw.then)
					progress = true
					break
				}
			}
		}
	}
	if len(joins) > 0 || !finished {
		t.Fatalf("simulation: the workflow did not complete (joins waiting %d, order %v)", len(joins), order)
	}
	if len(order) != len(p.Steps) {
		t.Fatalf("simulation: %d steps ran, want %d", len(order), len(p.Steps))
	}
}

func allDone(done map[string]bool, refs []string) bool {
	for _, r := range refs {
		if !done[r] {
			return false
		}
	}
	return true
}

func cloneSet(s map[string]bool) map[string]bool {
	c := make(map[string]bool, len(s))
	for k := range s {
		c[k] = true
	}
	return c
}

func keys(s map[string]bool) []string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ancestors returns every step's transitive dependencies.
func ancestors(p *Plan) map[string]map[string]bool {
	deps := map[string][]string{}
	for _, s := range p.Steps {
		deps[s.StepID] = s.DependsOn
	}
	memo := map[string]map[string]bool{}
	var walk func(id string) map[string]bool
	walk = func(id string) map[string]bool {
		if m, ok := memo[id]; ok {
			return m
		}
		m := map[string]bool{}
		for _, d := range deps[id] {
			m[d] = true
			for a := range walk(d) {
				m[a] = true
			}
		}
		memo[id] = m
		return m
	}
	for _, s := range p.Steps {
		walk(s.StepID)
	}
	return memo
}

// dagPlan returns a plan of noop steps named by names with the given
// dependencies (by index), in the given plan order.
func dagPlan(names []string, deps map[int][]int, order []int) *Plan {
	p := &Plan{PlanID: "dag", PlanVersion: "1"}
	for _, i := range order {
		s := Step{StepID: names[i], Executor: ExecutorSpec{Type: ExecutorNoop}}
		for _, d := range deps[i] {
			s.DependsOn = append(s.DependsOn, names[d])
		}
		p.Steps = append(p.Steps, s)
	}
	return p
}

var nameParts = []string{"a", "b", "build", "deploy.eu", "test 1", "ünï", "s_x", "fork_1", "join_1", "x-y", "日本", "${workflow.input.runId}", "_41"}

func randomNames(rng *rand.Rand, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", nameParts[rng.IntN(len(nameParts))], i)
	}
	return names
}

// randomDAG returns a random plan of n steps: each pair i<j of a random
// permutation is an edge with probability density.
func randomDAG(rng *rand.Rand, n int, density float64) *Plan {
	names := randomNames(rng, n)
	perm := rng.Perm(n)
	deps := map[int][]int{}
	for j := 0; j < n; j++ {
		for i := 0; i < j; i++ {
			if rng.Float64() < density {
				deps[perm[j]] = append(deps[perm[j]], perm[i])
			}
		}
	}
	return dagPlan(names, deps, rng.Perm(n))
}

// randomSP returns a random series-parallel plan of n steps built by series
// composition (every sink of the first part before every source of the
// second) and parallel composition.
func randomSP(rng *rand.Rand, n int) *Plan {
	names := randomNames(rng, n)
	deps := map[int][]int{}
	next := 0
	// gen returns the sources and sinks of a new part of size k.
	var gen func(k int) (sources, sinks []int)
	gen = func(k int) ([]int, []int) {
		if k == 1 {
			v := next
			next++
			return []int{v}, []int{v}
		}
		a := 1 + rng.IntN(k-1)
		srcA, snkA := gen(a)
		srcB, snkB := gen(k - a)
		if rng.IntN(2) == 0 { // series
			for _, b := range srcB {
				deps[b] = append(deps[b], snkA...)
			}
			return srcA, snkB
		}
		return append(srcA, srcB...), append(snkA, snkB...)
	}
	gen(n)
	return dagPlan(names, deps, rng.Perm(n))
}

func mustCompile(t testing.TB, p *Plan) *Compiled {
	t.Helper()
	c, err := Compile(p)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

func TestCompile_Order(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	t.Run("Diamond", func(t *testing.T) {
		p := dagPlan([]string{"a", "b", "c", "d"}, map[int][]int{1: {0}, 2: {0}, 3: {1, 2}}, []int{0, 1, 2, 3})
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, true, 20, rng)
		if got := shape(c.Workflow.Tasks); got != "a (b | c) d" {
			t.Fatalf("layout %q, want %q", got, "a (b | c) d")
		}
	})
	t.Run("NShape", func(t *testing.T) {
		// a->c, b->c, b->d: not series-parallel.
		p := dagPlan([]string{"a", "b", "c", "d"}, map[int][]int{2: {0, 1}, 3: {1}}, []int{0, 1, 2, 3})
		c := mustCompile(t, p)
		before := checkCompiledOrder(t, p, c, false, 20, rng)
		if got, want := shape(c.Workflow.Tasks), "(a | b) (c | d)"; got != want {
			t.Fatalf("layout %q, want %q", got, want)
		}
		if !before["d"]["a"] {
			t.Fatalf("d should wait for a in the level layout: %v", before["d"])
		}
	})
	t.Run("NShapeInsideSeries", func(t *testing.T) {
		// s -> {a, b}; a->c, b->c, b->d; {c, d} -> e: the series around the
		// N still decomposes. Branches follow the plan's order, reversed here.
		p := dagPlan([]string{"s", "a", "b", "c", "d", "e"},
			map[int][]int{1: {0}, 2: {0}, 3: {1, 2}, 4: {2}, 5: {3, 4}}, []int{5, 4, 3, 2, 1, 0})
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, false, 20, rng)
		if got, want := shape(c.Workflow.Tasks), "s (b | a) (d | c) e"; got != want {
			t.Fatalf("layout %q, want %q", got, want)
		}
	})
	t.Run("Independent", func(t *testing.T) {
		p := dagPlan([]string{"x", "y", "z"}, nil, []int{0, 1, 2})
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, true, 5, rng)
		if got, want := shape(c.Workflow.Tasks), "(x | y | z)"; got != want {
			t.Fatalf("layout %q, want %q", got, want)
		}
	})
	t.Run("Single", func(t *testing.T) {
		p := dagPlan([]string{"only"}, nil, []int{0})
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, true, 1, rng)
		if len(c.Workflow.Tasks) != 1 {
			t.Fatalf("got %d tasks", len(c.Workflow.Tasks))
		}
	})
	t.Run("NestedForks", func(t *testing.T) {
		// a -> (b -> (c | d) -> e | f) -> g
		p := dagPlan([]string{"a", "b", "c", "d", "e", "f", "g"},
			map[int][]int{1: {0}, 2: {1}, 3: {1}, 4: {2, 3}, 5: {0}, 6: {4, 5}}, []int{6, 0, 5, 1, 4, 2, 3})
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, true, 20, rng)
		if got, want := shape(c.Workflow.Tasks), "a (f | b (c | d) e) g"; got != want {
			t.Fatalf("layout %q, want %q", got, want)
		}
	})
	t.Run("RandomDAGs", func(t *testing.T) {
		for i := 0; i < 400; i++ {
			n := 1 + rng.IntN(24)
			p := randomDAG(rng, n, rng.Float64()*0.6)
			c := mustCompile(t, p)
			checkCompiledOrder(t, p, c, false, 3, rng)
		}
	})
	t.Run("RandomSeriesParallelExact", func(t *testing.T) {
		for i := 0; i < 400; i++ {
			p := randomSP(rng, 1+rng.IntN(24))
			c := mustCompile(t, p)
			checkCompiledOrder(t, p, c, true, 3, rng)
		}
	})
	t.Run("Deterministic", func(t *testing.T) {
		p := randomDAG(rng, 30, 0.2)
		a, b := mustCompile(t, p), mustCompile(t, p)
		if shape(a.Workflow.Tasks) != shape(b.Workflow.Tasks) {
			t.Fatal("two compilations differ")
		}
	})
	t.Run("MaxSteps", func(t *testing.T) {
		p := randomDAG(rng, MaxSteps, 0.01)
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, false, 1, rng)
	})
}

// shape renders a task list: steps by stepId, series by spaces, forks as
// (branch | branch).
func shape(seq []model.WorkflowTask) string {
	var parts []string
	for _, wt := range seq {
		switch wt.Type_ {
		case "SIMPLE":
			id, _ := StepIDFromRef(wt.TaskReferenceName)
			parts = append(parts, id)
		case "FORK_JOIN":
			var bs []string
			for _, b := range wt.ForkTasks {
				bs = append(bs, shape(b))
			}
			parts = append(parts, "("+strings.Join(bs, " | ")+")")
		}
	}
	return strings.Join(parts, " ")
}

// FuzzCompile_Order compiles DAGs drawn from the fuzzer's bytes and checks
// the order.
func FuzzCompile_Order(f *testing.F) {
	f.Add([]byte{4, 0, 1, 0, 2, 1, 3, 2, 3})
	f.Add([]byte{4, 0, 2, 1, 2, 1, 3})
	f.Add([]byte{9, 0, 1, 1, 2, 0, 3, 3, 4, 2, 5, 4, 5, 6, 7, 7, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		n := 1 + int(data[0])%40
		deps := map[int][]int{}
		seen := map[[2]int]bool{}
		for i := 1; i+1 < len(data); i += 2 {
			a, b := int(data[i])%n, int(data[i+1])%n
			if a == b {
				continue
			}
			if a > b {
				a, b = b, a
			}
			if !seen[[2]int{a, b}] {
				seen[[2]int{a, b}] = true
				deps[b] = append(deps[b], a)
			}
		}
		names := make([]string, n)
		order := make([]int, n)
		for i := range names {
			names[i] = fmt.Sprintf("s.%d", i)
			order[i] = n - 1 - i
		}
		p := dagPlan(names, deps, order)
		c := mustCompile(t, p)
		checkCompiledOrder(t, p, c, false, 2, rand.New(rand.NewPCG(uint64(len(data)), 7)))
	})
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }
