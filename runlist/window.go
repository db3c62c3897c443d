package runlist

import "container/heap"

// DefaultMaxFinished is how many finished runs' rows a replica keeps in
// memory (Options.MaxFinished).
const DefaultMaxFinished = 10_000

// window bounds the finished rows a replica keeps in memory: the newest
// max of them in the list's order (newest created first). Open runs'
// rows are always kept: they are what admission, drains and bulk actions
// look at. Once a finished row was let go, bound is its position; every
// finished row at or beyond bound is in the bucket only, and a listing
// that reaches bound reads on from the bucket. bound only moves towards
// the newest, so what is in memory and what is not never overlap.
//
// outside names the finished rows at or beyond bound that the bucket
// still holds, while outsideKnown: a row let go joins it, a row removed
// from the bucket (ForgetRun's marker) leaves it. While it is known and
// empty, nothing beyond bound exists and a listing reads no bucket. It
// holds at most outsideFactor*max runIds (a runId costs about a tenth of
// a row); past that, or when the replica started from a floor (the rows
// beyond it were never read), it is not known and a listing that reaches
// bound reads the bucket; a read that finds no finished row beyond bound,
// with no row let go meanwhile, makes it known (and empty) again.
type window struct {
	max   int
	heap  finHeap // the finished rows kept, oldest on top
	bound *entry  // position of the newest row let go (nil: none)
	// evictedRev is the highest revision of a row let go.
	evictedRev   uint64
	outside      map[string]struct{}
	outsideKnown bool
	// letGoN counts the rows let go, known or not.
	letGoN uint64
}

// outsideFactor bounds window.outside: at most this many runIds per
// finished row kept.
const outsideFactor = 10

func newWindow(max int) window {
	return window{max: max, outside: map[string]struct{}{}, outsideKnown: true}
}

// noneBeyond reports whether the window knows that no finished row
// exists at or beyond its bound.
func (w *window) noneBeyond() bool {
	return w.bound == nil || (w.outsideKnown && len(w.outside) == 0)
}

// letGo notes that the bucket holds runID's finished row beyond bound.
func (w *window) letGo(runID string) {
	w.letGoN++
	if !w.outsideKnown {
		return
	}
	if _, ok := w.outside[runID]; !ok && len(w.outside) >= outsideFactor*w.max {
		w.forgetOutside()
		return
	}
	w.outside[runID] = struct{}{}
}

// forgetOutside gives up knowing which rows are beyond bound.
func (w *window) forgetOutside() {
	w.outside, w.outsideKnown = nil, false
}

// noneFound notes that a read of the bucket found no finished row
// beyond bound, a read begun when bound and letGoN were as given: unless
// a row was let go since (the read may have missed it), none is there.
func (w *window) noneFound(bound *entry, letGoN uint64) {
	if w.bound == bound && w.letGoN == letGoN && !w.outsideKnown {
		w.outside, w.outsideKnown = map[string]struct{}{}, true
	}
}

// gone notes that runID's row left the bucket or came into memory.
func (w *window) gone(runID string) {
	delete(w.outside, runID)
}

// beyond reports whether e is at or beyond the bound: a finished row
// there is not kept.
func (w *window) beyond(e *entry) bool {
	return w.bound != nil && !before(e, w.bound)
}

// keep adds the finished row e to the window (if it is not there) and
// returns the rows let go to keep at most max: the oldest, maybe e.
func (w *window) keep(e *entry) []*entry {
	if e.finIndex < 0 {
		heap.Push(&w.heap, e)
	}
	var out []*entry
	for len(w.heap) > w.max {
		old := heap.Pop(&w.heap).(*entry)
		w.bound = &entry{created: old.created, row: Row{RunID: old.row.RunID}}
		w.evictedRev = max(w.evictedRev, old.rev)
		w.letGo(old.row.RunID)
		out = append(out, old)
	}
	return out
}

// remove takes e out of the window, if it is there.
func (w *window) remove(e *entry) {
	if e.finIndex >= 0 {
		heap.Remove(&w.heap, e.finIndex)
	}
}

// finHeap orders entries oldest first (the last in the list's order).
type finHeap []*entry

func (h finHeap) Len() int           { return len(h) }
func (h finHeap) Less(i, j int) bool { return before(h[j], h[i]) }
func (h finHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].finIndex, h[j].finIndex = i, j
}
func (h *finHeap) Push(x any) {
	e := x.(*entry)
	e.finIndex = len(*h)
	*h = append(*h, e)
}
func (h *finHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.finIndex = -1
	*h = old[:len(old)-1]
	return e
}
