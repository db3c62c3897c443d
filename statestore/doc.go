// Package statestore is the run event contract of the sidecar and its append
// authority.
//
// It holds the event envelope of the Run Events Contract v2.0.1
// ([RunEventWrite], [RunEventRecord]), the idempotencyKey derivation
// ([IdempotencyKey]), validation before append ([ValidateWrite]), the run and
// step transition tables, the projector that reduces a run's records into a
// [RunSnapshot], and the [Store] interface that every backend implements.
//
// Backends live in sub-packages (memstore, natsstore) and all pass the one
// conformance suite in package storetest.
package statestore
