package statestore

// CachedRuns exposes the number of runs a Projector keeps, for tests.
func (p *Projector) CachedRuns() int { return p.cachedRuns() }
