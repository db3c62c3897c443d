// Package adapter is the sidecar's Conductor side: the HTTP client of
// Conductor's API (Client), the plan language and its compiler to
// Conductor workflow definitions (subpackage plan), the run index that
// maps a run to its workflow in a JetStream KV bucket (Runs: idempotent
// starts under a lease, shared by any number of replicas), and the run
// watcher that follows each run's workflow until it ends and appends the
// terminal run event (Watcher).
//
// What happens to a pause is not decided here: the watcher tells the
// pause follower it is given (PauseFollower; package drain's Follower)
// what it saw of a workflow, and counts what it did. adapter imports no
// package above statestore; its consumers declare the methods of Runs
// they use (admission.Runs, httpapi.Starter, taskworkers' guard).
package adapter
