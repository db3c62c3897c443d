// Package monitoring holds the tests of the shipped Prometheus alert rules
// (deploy/prometheus) and Grafana dashboard (deploy/grafana). It has no
// code of its own: its tests run promtool on the rules, and run the sidecar
// binary, a real Prometheus and the real Conductor to check that every
// dashboard query and alert expression returns data and that
// PAUSE_DRAIN_TIMEOUT fires.
//
// Prometheus comes from Debian's package: deploy/prometheus/install.sh
// installs it. Without promtool/prometheus the tests skip and say so.
package monitoring
