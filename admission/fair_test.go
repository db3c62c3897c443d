package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestAdmission_FairAcrossTenants: under a global limit, the runs that
// wait are taken round-robin across tenants, each tenant's in submission
// order: a tenant that queued many runs does not put another tenant's
// first run behind all of them.
func TestAdmission_FairAcrossTenants(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Queue})
	defer c.Close(context.Background())
	var a []string
	for i := range 6 {
		d, err := e.submit(c, "tenant-a", fmt.Sprintf("fair-a-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		a = append(a, d.RunID)
	}
	d, err := e.submit(c, "tenant-b", "fair-b-0")
	if err != nil {
		t.Fatal(err)
	}
	b := d.RunID
	// Waiting: a1 a2 a3 a4 a5 (tenant a), b0 (tenant b): b0 is second.
	if d.State != statestore.RunStatusQueued || d.Position != 2 {
		t.Fatalf("tenant b's first run behind tenant a's queue: %+v, want QUEUED at position 2", d)
	}
	if p := c.Position(a[5]); p != 6 {
		t.Fatalf("tenant a's last run: position %d, want 6", p)
	}
	e.end(a[0])
	e.waitStarted(a[1])
	e.end(a[1])
	e.waitStarted(b)
	time.Sleep(300 * time.Millisecond)
	if e.started(a[2]) {
		t.Fatal("tenant a's third run started before tenant b's first")
	}
}

// TestAdmission_TenantLimitBlocksOnlyTheTenant: a run held by its own
// tenant's limit holds back later runs of that tenant only: another
// tenant's start, with room under every limit, starts at once.
func TestAdmission_TenantLimitBlocksOnlyTheTenant(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{PerTenant: 1, Global: 10}, Policy: admission.Queue})
	defer c.Close(context.Background())
	for i := range 3 {
		if _, err := e.submit(c, "tenant-a", fmt.Sprintf("hol-a-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := e.submit(c, "tenant-b", "hol-b-0")
	if err != nil {
		t.Fatal(err)
	}
	if d.Started == nil {
		t.Fatalf("tenant b's first run, under every limit: %+v, want started", d)
	}
}
