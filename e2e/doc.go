// Package e2e holds the end-to-end tests: each runs the sidecar binary as a
// process ("sidecar serve" and the client subcommands, through package
// sidecartest) against the real conductor-oss server
// (SIDECAR_TEST_CONDUCTOR_URL; without it they skip and say so), with the
// embedded NATS server or the backends a test asks for: PostgreSQL
// (SIDECAR_TEST_POSTGRES=1), a NATS cluster (SIDECAR_TEST_NATS_CLUSTER=1),
// Conductor on PostgreSQL (SIDECAR_TEST_CONDUCTOR_POSTGRES=1), the chaos
// wave (SIDECAR_TEST_CHAOS=1).
//
//	go test -count=1 -p 1 ./e2e/
package e2e
