package proctest

import "testing"

// Two addresses a test asks for are two servers' addresses: FreeAddr
// never hands out the same port twice in one test process, although the
// kernel, once the probe listener is closed, may give the port out again.
func TestFreeAddr_NeverTheSamePortTwice(t *testing.T) {
	given.mu.Lock()
	before := given.addrs
	given.addrs = map[string]bool{}
	given.mu.Unlock()
	t.Cleanup(func() {
		given.mu.Lock()
		defer given.mu.Unlock()
		for addr := range given.addrs {
			before[addr] = true
		}
		given.addrs = before
	})

	seen := map[string]bool{}
	for i := range 2000 {
		addr := FreeAddr(t)
		if seen[addr] {
			t.Fatalf("pick %d: %s handed out before", i, addr)
		}
		seen[addr] = true
	}
}
