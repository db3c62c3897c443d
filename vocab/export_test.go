package vocab

import "github.com/conductor-sidecar/sidecar/statestore"

// CoreEvents translates a run's records (in runSeq order) into Core
// Events. docs/events.md has the table.
func CoreEvents(recs []statestore.RunEventRecord) []CoreEvent {
	out, _ := coreEvents(recs)
	return out
}

// NoETLEvents translates a run's records (in runSeq order) into NoETL v10
// events. docs/events.md has the table.
func NoETLEvents(recs []statestore.RunEventRecord) []NoETLEvent {
	out, _ := noetlEvents(recs)
	return out
}
