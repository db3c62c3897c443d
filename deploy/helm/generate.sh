#!/usr/bin/env bash
# Rewrites what is generated from the Helm chart or for it, after a change
# of the chart, its values files, deploy/prometheus/alerts.yml or the
# Grafana dashboard:
#   - deploy/kubernetes/sidecar.yaml and replicated/sidecar.yaml: helm
#     template of examples/one-pod.yaml and examples/replicated.yaml;
#   - conductor-sidecar/files/: the chart's copies of the alert rules and
#     the dashboard;
#   - the values reference in docs/helm.md, from values.schema.json.
# deploy/kubernetes's TestChart_GeneratedFiles fails while any is stale.
set -euo pipefail
cd "$(dirname "$0")/../kubernetes"
HELM="$(../helm/install.sh)/helm" go test -count=1 -run '^TestChart_GeneratedFiles$' . -args -update
