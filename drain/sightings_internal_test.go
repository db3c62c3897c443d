package drain

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkSightings_Full: checks of a new difference while the memory
// is full of differences too young to drop: the first looks through
// them all, the others within sweepEvery do not.
func BenchmarkSightings_Full(b *testing.B) {
	t := &sightings{runs: map[string]sighting{}, max: DefaultMaxSightings}
	now := time.Now()
	for i := range DefaultMaxSightings {
		t.lasted(fmt.Sprintf("run-%d", i), sighting{logCycle: 1}, now, DefaultGrace)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t.lasted("new", sighting{logCycle: 1}, now, DefaultGrace)
	}
}

// BenchmarkSightings_Seen: a check of a remembered difference.
func BenchmarkSightings_Seen(b *testing.B) {
	t := &sightings{runs: map[string]sighting{}, max: DefaultMaxSightings}
	now := time.Now()
	for i := range DefaultMaxSightings - 1 {
		t.lasted(fmt.Sprintf("run-%d", i), sighting{logCycle: 1}, now, DefaultGrace)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t.lasted("run-1", sighting{logCycle: 1}, now, DefaultGrace)
	}
}
