package statestore

// CachedRuns exposes the number of runs a Projector keeps, for tests.
func (p *Projector) CachedRuns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lru.Len()
}

// IdempotencyKey derives the idempotencyKey for an event from its six
// participating fields. tenantId, projectId, environmentId and engineAttemptId
// do not participate. It does not check the fields; ValidateWrite does.
func IdempotencyKey(runID, stepID string, logicalAttemptID int64, eventType, planID, planVersion string) string {
	return KeyInput{runID, stepID, logicalAttemptID, eventType, planID, planVersion}.Key()
}
