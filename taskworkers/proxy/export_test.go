package proxy

// Remembers reports whether p still holds taskID among the tasks its
// polls handed out.
func Remembers(p *Proxy, taskID string) bool {
	_, _, known := p.seen.get(taskID)
	return known
}
