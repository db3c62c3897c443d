package plan

import "slices"

// block is a part of a plan's DAG as the compiler lays it out: one step, a
// series of blocks run one after the other, or blocks run in parallel
// (a FORK_JOIN with one branch per block, then a JOIN).
type block struct {
	step     int // the step's index when series and parallel are nil
	series   []*block
	parallel []*block
}

// dag is a plan's dependency graph by step index.
type dag struct {
	deps [][]int  // deps[v]: the steps v depends on
	anc  []bitset // anc[v]: every step v depends on, transitively
	pos  []int    // pos[v]: v's place in topo
	topo []int    // a topological order, dependencies first
}

// newDAG builds the graph of a valid plan (no unknown dependency, no cycle).
// The topological order prefers the lower plan index among ready steps, so
// the compiled layout is deterministic.
func newDAG(deps [][]int) *dag {
	n := len(deps)
	g := &dag{deps: deps, anc: make([]bitset, n), pos: make([]int, n)}
	waiting := make([]int, n) // unresolved dependencies
	users := make([][]int, n) // users[d]: the steps that depend on d
	for v, ds := range deps {
		waiting[v] = len(ds)
		for _, d := range ds {
			users[d] = append(users[d], v)
		}
	}
	ready := make([]int, 0, n)
	for v := range n {
		if waiting[v] == 0 {
			ready = append(ready, v)
		}
	}
	for len(ready) > 0 {
		i := indexOfMin(ready)
		v := ready[i]
		ready = slices.Delete(ready, i, i+1)
		g.pos[v] = len(g.topo)
		g.topo = append(g.topo, v)
		g.anc[v] = newBitset(n)
		for _, d := range deps[v] {
			g.anc[v].or(g.anc[d])
			g.anc[v].set(d)
		}
		for _, u := range users[v] {
			if waiting[u]--; waiting[u] == 0 {
				ready = append(ready, u)
			}
		}
	}
	return g
}

func indexOfMin(s []int) int {
	m := 0
	for i, v := range s {
		if v < s[m] {
			m = i
		}
	}
	return m
}

// layout returns the block of the whole plan.
func (g *dag) layout() *block {
	return g.build(slices.Clone(g.topo))
}

// build lays out the steps of set, given in topological order. set is
// always convex (a path between two of its steps stays inside it), so the
// ancestor sets restricted to set are its own.
//
//   - One step: itself.
//   - Not (weakly) connected: its components in parallel.
//   - Connected with a series cut, i.e. a split into A then B where every
//     step of B depends (transitively) on every step of A: A then B, with
//     the smallest such A. This adds no waiting: a step of B could not
//     start before all of A anyway. Series-parallel DAGs decompose fully
//     this way and compile with no added waiting.
//   - Connected without a series cut (not series-parallel, e.g. the N
//     shape a->c, b->c, b->d): its sources (the steps with no dependency
//     inside set) in parallel, then the rest. This never breaks a
//     dependency, but a step of the rest may wait for a source it does not
//     depend on.
//
// The series cut is looked for first: a set that has one is connected, so
// its components need not be computed (each is a pass over every
// dependency of the set, and a dense plan, where each step depends on all
// before it, is cut once per step).
func (g *dag) build(set []int) *block {
	if len(set) == 1 {
		return &block{step: set[0]}
	}
	k := g.seriesCut(set)
	if k > 0 {
		return series(g.build(set[:k]), g.build(set[k:]))
	}
	if comps := g.components(set); len(comps) > 1 {
		b := &block{}
		for _, c := range comps {
			b.parallel = append(b.parallel, g.build(c))
		}
		return b
	}
	var sources, rest []int
	in := newBitset(len(g.deps))
	for _, v := range set {
		in.set(v)
	}
	for _, v := range set {
		if g.hasDepIn(v, in) {
			rest = append(rest, v)
		} else {
			sources = append(sources, v)
		}
	}
	return series(g.build(sources), g.build(rest))
}

// series joins a and b one after the other, flattening nested series.
func series(a, b *block) *block {
	s := &block{}
	for _, x := range [2]*block{a, b} {
		if x.series != nil {
			s.series = append(s.series, x.series...)
		} else {
			s.series = append(s.series, x)
		}
	}
	return s
}

func (g *dag) hasDepIn(v int, in bitset) bool {
	for _, d := range g.deps[v] {
		if in.has(d) {
			return true
		}
	}
	return false
}

// seriesCut returns the smallest k (0 < k < len(set)) such that every step
// of set[k:] has every step of set[:k] among its ancestors, or 0. Such a
// prefix is the same in every topological order, so checking the prefixes
// of one order finds it.
func (g *dag) seriesCut(set []int) int {
	prefix := newBitset(len(g.deps))
next:
	for k := 1; k < len(set); k++ {
		prefix.set(set[k-1])
		for _, b := range set[k:] {
			if !prefix.subsetOf(g.anc[b]) {
				continue next
			}
		}
		return k
	}
	return 0
}

// components splits set into its weakly connected components, each in
// topological order, ordered by their first step.
func (g *dag) components(set []int) [][]int {
	parent := make([]int, len(g.deps)) // -1: not in set
	for i := range parent {
		parent[i] = -1
	}
	for _, v := range set {
		parent[v] = v
	}
	find := func(v int) int {
		for parent[v] != v {
			parent[v] = parent[parent[v]]
			v = parent[v]
		}
		return v
	}
	for _, v := range set {
		for _, d := range g.deps[v] {
			if parent[d] >= 0 {
				parent[find(v)] = find(d)
			}
		}
	}
	var comps [][]int
	at := map[int]int{} // root -> index in comps
	for _, v := range set {
		r := find(v)
		i, ok := at[r]
		if !ok {
			i = len(comps)
			at[r] = i
			comps = append(comps, nil)
		}
		comps[i] = append(comps[i], v)
	}
	return comps
}

// bitset is a set of step indexes.
type bitset []uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (b bitset) set(i int)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) has(i int) bool { return b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) or(o bitset) {
	for i := range b {
		b[i] |= o[i]
	}
}
func (b bitset) subsetOf(o bitset) bool {
	for i := range b {
		if b[i]&^o[i] != 0 {
			return false
		}
	}
	return true
}
