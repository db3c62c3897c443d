package kubernetes

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// update rewrites the files generated from the chart instead of comparing
// them (deploy/helm/generate.sh).
var update = flag.Bool("update", false, "rewrite the files generated from the Helm chart")

const (
	chartDir    = "../helm/conductor-sidecar"
	examplesDir = "../helm/examples"
	releaseName = "sidecar"
)

// renders are the documented values files, alone or layered, each with the
// plain manifest rendered from it ("" when none is committed).
var renders = []struct {
	name   string
	values []string
	plain  string
}{
	{"OnePod", []string{"one-pod.yaml"}, "sidecar.yaml"},
	{"Replicated", []string{"replicated.yaml"}, "replicated/sidecar.yaml"},
	{"Postgres", []string{"postgres.yaml"}, ""},
	{"PrometheusOperator", []string{"replicated.yaml", "prometheus-operator.yaml"}, ""},
}

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary is helm from HELM, or as deploy/helm/install.sh builds it
// (the pinned version, cached). Without it the test skips, but under CI
// (CI=true) it fails: CI must run the chart's tests.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("HELM"); p != "" {
			helmPath = p
			return
		}
		cmd := exec.Command("../helm/install.sh")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			helmErr = fmt.Errorf("deploy/helm/install.sh: %v\n%s", err, stderr.Bytes())
			return
		}
		helmPath = filepath.Join(strings.TrimSpace(string(out)), "helm")
	})
	if helmErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("helm is needed in CI: %v", helmErr)
		}
		t.Skipf("helm cannot be built, so the chart is not tested: %v", helmErr)
	}
	return helmPath
}

// helm runs helm with args and returns its standard output, or its error
// with standard error.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valuesArgs is -f for each values file of examplesDir.
func valuesArgs(files []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", filepath.Join(examplesDir, f))
	}
	return args
}

// template renders the chart with the values files and extra arguments
// (--set ...).
func template(t *testing.T, files []string, extra ...string) (string, error) {
	t.Helper()
	args := append([]string{"template", releaseName, chartDir}, valuesArgs(files)...)
	return helm(t, append(args, extra...)...)
}

// decodeRender is every object of a render, decoded strictly.
func decodeRender(t *testing.T, out string) *manifests {
	t.Helper()
	docs, err := splitDocuments([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests{text: map[string]string{}}
	for i, doc := range docs {
		obj, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("document %d: %v\n%s", i+1, err, doc)
		}
		m.add(obj)
		m.text[fmt.Sprintf("document %d (%T)", i+1, obj)] = string(doc)
	}
	return m
}

// TestChart_Lint: helm lint --strict passes for every documented values
// file, with no template failure (lint reports a template's fail as
// "[INFO] Fail" and passes). With the chart's defaults the chart fails
// for want of what it cannot choose: the API's principals.
func TestChart_Lint(t *testing.T) {
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			cmd := exec.Command(helmBinary(t), append([]string{"lint", "--strict", chartDir}, valuesArgs(r.values)...)...)
			out, err := cmd.CombinedOutput()
			if err != nil || strings.Contains(string(out), "Fail:") || strings.Contains(string(out), "[WARNING]") {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
	t.Run("Defaults", func(t *testing.T) {
		out, err := template(t, nil)
		if err == nil || !strings.Contains(err.Error(), "auth.principals or auth.existingSecret is required") {
			t.Fatalf("helm template with the defaults: got %v\n%.2000s\nwant the failure that asks for auth.principals", err, out)
		}
	})
}

// TestChart_Render decodes every object of every documented render
// strictly with the Kubernetes (and Prometheus Operator) API types, and
// checks what each values file is for.
func TestChart_Render(t *testing.T) {
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			out, err := template(t, r.values)
			if err != nil {
				t.Fatal(err)
			}
			m := decodeRender(t, out)
			d := the(t, "Deployments", m.deployments)
			c := container(t, d, "sidecar")
			var cm *corev1.ConfigMap
			for _, x := range m.configMaps {
				if x.Name == c.EnvFrom[0].ConfigMapRef.Name {
					cm = x
				}
			}
			if cm == nil {
				t.Fatalf("no ConfigMap %s", c.EnvFrom[0].ConfigMapRef.Name)
			}
			for doc, text := range m.text {
				if strings.Contains(doc, "PrometheusRule") || strings.Contains(text, "sidecar-dashboard.json:") {
					continue // the alert rules and the dashboard name alerts SIDECAR_DOWN, SIDECAR_ABSENT
				}
				for _, name := range envNamesIn(text) {
					if !flags.isFlag(name) {
						t.Errorf("%s names %s, which is no flag of sidecar serve", doc, name)
					}
				}
			}
			for key := range cm.Data {
				if !flags.isFlag(key) {
					t.Errorf("ConfigMap key %s is no flag of sidecar serve", key)
				}
			}
			checkSecretModes(t, d)
			grace := flags.shutdownGrace(t, cm.Data["SIDECAR_SHUTDOWN_GRACE"])
			if p := d.Spec.Template.Spec.TerminationGracePeriodSeconds; p == nil || *p < int64((grace+stopBudget).Seconds()) {
				t.Errorf("terminationGracePeriodSeconds %s: want >= shutdown grace %v + %v", fmtSeconds(p), grace, stopBudget)
			}
			switch r.name {
			case "Postgres":
				checkPostgres(t, m, c, cm)
			case "PrometheusOperator":
				checkPrometheusOperator(t, m, d)
			case "Replicated":
				checkTaskProxy(t, m, c, cm, true)
			}
		})
	}
}

// checkPostgres: the log in PostgreSQL, the password from a Secret and not
// in the URL, the embedded NATS server still on its volume.
func checkPostgres(t *testing.T, m *manifests, c *corev1.Container, cm *corev1.ConfigMap) {
	t.Helper()
	store := cm.Data["SIDECAR_STORE"]
	if !strings.HasPrefix(store, "postgres://") || strings.Contains(strings.SplitN(strings.TrimPrefix(store, "postgres://"), "@", 2)[0], ":") {
		t.Errorf("SIDECAR_STORE %q: want a postgres:// URL without a password", store)
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "PGPASSWORD" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil || c.Env[i].ValueFrom.SecretKeyRef.Name == "" {
		t.Error("PGPASSWORD must come from a Secret")
	}
	if cm.Data["SIDECAR_DATA_DIR"] == "" || len(m.claims) != 1 {
		t.Error("the embedded NATS server keeps the run index beside the database: want SIDECAR_DATA_DIR on a claim")
	}
	if len(m.secrets) != 0 {
		t.Errorf("auth.existingSecret is set: the chart must make no tokens Secret, got %d", len(m.secrets))
	}
}

// checkTaskProxy: the task proxy listens on all interfaces on the port the
// container, the Service and the NetworkPolicy name conductor-proxy, with
// the tokens file from its Secret, or explicitly without a token of its own.
func checkTaskProxy(t *testing.T, m *manifests, c *corev1.Container, cm *corev1.ConfigMap, tokens bool) {
	t.Helper()
	listen := cm.Data["SIDECAR_CONDUCTOR_PROXY_LISTEN"]
	if listen != "0.0.0.0:8788" {
		t.Errorf("SIDECAR_CONDUCTOR_PROXY_LISTEN %q, want 0.0.0.0:8788", listen)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "conductor-proxy" && p.ContainerPort == 8788 }) {
		t.Errorf("container ports %v: want conductor-proxy 8788", c.Ports)
	}
	svc := the(t, "Services", m.services)
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == "conductor-proxy" && p.Port == 8788 && p.TargetPort.StrVal == "conductor-proxy"
	}) {
		t.Errorf("Service ports %v: want conductor-proxy 8788", svc.Spec.Ports)
	}
	np := the(t, "NetworkPolicies", m.policies)
	if !slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return len(r.Ports) == 1 && r.Ports[0].Port != nil && r.Ports[0].Port.StrVal == "conductor-proxy"
	}) {
		t.Errorf("the NetworkPolicy admits nobody to port conductor-proxy: %+v", np.Spec.Ingress)
	}
	file, noAuth := cm.Data["SIDECAR_CONDUCTOR_PROXY_TOKEN_FILE"], cm.Data["SIDECAR_CONDUCTOR_PROXY_NO_AUTH"]
	if !tokens {
		if file != "" || noAuth != "true" {
			t.Errorf("no tokenSecret: want SIDECAR_CONDUCTOR_PROXY_NO_AUTH=true and no token file, got %q, %q", noAuth, file)
		}
		return
	}
	if noAuth != "" || file == "" {
		t.Fatalf("tokenSecret: want SIDECAR_CONDUCTOR_PROXY_TOKEN_FILE and no NO_AUTH, got %q, %q", file, noAuth)
	}
	i := slices.IndexFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return strings.HasPrefix(file, v.MountPath+"/") })
	if i < 0 || !c.VolumeMounts[i].ReadOnly {
		t.Errorf("the token file %s is on no read-only mount: %+v", file, c.VolumeMounts)
	}
}

// TestChart_TaskProxyNoAuthSaidOutLoud: a task proxy without tokens of its
// own renders only with taskProxy.insecureNoAuth (serve's
// SIDECAR_CONDUCTOR_PROXY_NO_AUTH); without it, or a tokenSecret, the
// chart refuses (TestChart_BadValuesFail, ProxyWithoutTokens).
func TestChart_TaskProxyNoAuthSaidOutLoud(t *testing.T) {
	out, err := template(t, []string{"one-pod.yaml"}, "--set", "taskProxy.enabled=true", "--set", "taskProxy.insecureNoAuth=true")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeRender(t, out)
	c := container(t, the(t, "Deployments", m.deployments), "sidecar")
	cm := sidecarConfigMap(t, m, c)
	checkTaskProxy(t, m, c, cm, false)
}

// TestChart_TaskProxyTokens: with taskProxy.tokenSecret the proxy reads its
// tokens from that Secret, mounted 0440 like the chart's other Secrets.
func TestChart_TaskProxyTokens(t *testing.T) {
	out, err := template(t, []string{"one-pod.yaml"}, "--set", "taskProxy.enabled=true", "--set", "taskProxy.tokenSecret.name=proxy-tokens")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeRender(t, out)
	d := the(t, "Deployments", m.deployments)
	c := container(t, d, "sidecar")
	cm := sidecarConfigMap(t, m, c)
	checkTaskProxy(t, m, c, cm, true)
	checkSecretModes(t, d)
	if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == "proxy-tokens"
	}) {
		t.Error("no volume of the Secret proxy-tokens")
	}
}

// TestChart_AdoptAndRetention: taskProxy.adopt and retention reach serve as
// its variables (every ConfigMap key a flag of serve), the retention
// role's pgpass file and the NATS retention user's password from their
// Secrets, mounted read-only 0440 where the variables point.
func TestChart_AdoptAndRetention(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		set    []string
		want   map[string]string
		mounts map[string]string // secret name -> file the env points at
	}{
		{"NATS", []string{"replicated.yaml"}, []string{"taskProxy.adopt={orders,billing:3}", "taskProxy.adoptInterval=2s", "taskProxy.adoptOnStepFailure=pause", "taskProxy.maxUpstreamConnections=128", "conductor.maxConcurrentCalls=32",
			"retention.finished=720h", "retention.archive=s3://archive/sidecar", "retention.conductor=false", "retention.natsPasswordSecret.name=nats-retention", "retention.archiveKeySecret.name=archive-keys"},
			map[string]string{"SIDECAR_ADOPT": "orders,billing:3", "SIDECAR_ADOPT_INTERVAL": "2s", "SIDECAR_ADOPT_ON_STEP_FAILURE": "pause", "SIDECAR_CONDUCTOR_PROXY_MAX_UPSTREAM_CONNECTIONS": "128", "SIDECAR_CONDUCTOR_MAX_CONCURRENT_CALLS": "32", "SIDECAR_RETAIN_FINISHED": "720h",
				"SIDECAR_ARCHIVE": "s3://archive/sidecar", "SIDECAR_RETAIN_CONDUCTOR": "false"},
			map[string]string{"nats-retention": "SIDECAR_RETENTION_NATS_PASSWORD_FILE", "archive-keys": "SIDECAR_ARCHIVE_KEY_FILE"}},
		{"Postgres", []string{"postgres.yaml"}, []string{"store.passwordSecret.name=", "retention.finished=48h", "retention.archive=s3://archive/pg",
			"retention.store=postgres://sidecar_retention@postgres.db.svc:5432/sidecar", "retention.passfileSecret.name=sidecar-pgpass"},
			map[string]string{"SIDECAR_RETAIN_FINISHED": "48h", "SIDECAR_RETENTION_STORE": "postgres://sidecar_retention@postgres.db.svc:5432/sidecar",
				"SIDECAR_RETAIN_CONDUCTOR": "true"},
			map[string]string{"sidecar-pgpass": "PGPASSFILE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			for _, s := range tc.set {
				extra = append(extra, "--set", s)
			}
			out, err := template(t, tc.values, extra...)
			if err != nil {
				t.Fatal(err)
			}
			m := decodeRender(t, out)
			d := the(t, "Deployments", m.deployments)
			c := container(t, d, "sidecar")
			var cm *corev1.ConfigMap
			for _, x := range m.configMaps {
				if x.Name == c.EnvFrom[0].ConfigMapRef.Name {
					cm = x
				}
			}
			if cm == nil {
				t.Fatal("no ConfigMap of the sidecar's")
			}
			for key := range cm.Data {
				if !flags.isFlag(key) {
					t.Errorf("ConfigMap key %s is no flag of sidecar serve", key)
				}
			}
			for k, v := range tc.want {
				if cm.Data[k] != v {
					t.Errorf("%s = %q, want %q", k, cm.Data[k], v)
				}
			}
			checkSecretModes(t, d)
			env := map[string]string{}
			for k, v := range cm.Data {
				env[k] = v
			}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			for secret, variable := range tc.mounts {
				vi := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == secret })
				if vi < 0 {
					t.Fatalf("no volume of the Secret %s", secret)
				}
				vol := d.Spec.Template.Spec.Volumes[vi]
				file := env[variable]
				mi := slices.IndexFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.Name == vol.Name })
				if mi < 0 || !c.VolumeMounts[mi].ReadOnly || len(vol.Secret.Items) != 1 ||
					file != c.VolumeMounts[mi].MountPath+"/"+vol.Secret.Items[0].Path {
					t.Errorf("%s = %q is not the read-only mount of the Secret %s: %+v %+v", variable, file, secret, c.VolumeMounts, vol)
				}
			}
			if _, ok := env["PGPASSWORD"]; ok && tc.name == "Postgres" {
				t.Error("PGPASSWORD is set beside PGPASSFILE: it would be used for the retention role too")
			}
		})
	}
}

// checkPrometheusOperator: the ServiceMonitor scrapes the metrics port of
// the pods under the alert rules' job, the PrometheusRule is the project's
// alert rules (promtool checks them), and the dashboard ConfigMap is the
// project's dashboard with the label Grafana's sidecar loads.
func checkPrometheusOperator(t *testing.T, m *manifests, d *appsv1.Deployment) {
	t.Helper()
	sm := the(t, "ServiceMonitors", m.serviceMonitors)
	svc := the(t, "Services", m.services)
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the Service's labels %v lack", k, v, svc.Labels)
		}
	}
	ep := the(t, "ServiceMonitor endpoints", sm.Spec.Endpoints)
	if ep.Port != "metrics" || ep.Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoint port %q path %q: want the Service's port metrics, /metrics", ep.Port, ep.Path)
	}
	job := ""
	for _, r := range ep.RelabelConfigs {
		if r.TargetLabel == "job" && r.Replacement != nil {
			job = *r.Replacement
		}
	}
	if job != "sidecar" {
		t.Errorf("ServiceMonitor job %q: want sidecar, the job alerts.yml selects", job)
	}
	if len(svc.Annotations) != 0 {
		t.Errorf("Service annotations %v: the ServiceMonitor scrapes, the prometheus.io annotations would scrape twice", svc.Annotations)
	}

	rule := the(t, "PrometheusRules", m.rules)
	specJSON, err := json.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(specJSON, &got); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if gj, wj := mustJSON(t, got), mustJSON(t, want); gj != wj {
		t.Errorf("the PrometheusRule's groups differ from deploy/prometheus/alerts.yml:\n got %s\nwant %s", gj, wj)
	}
	rulesFile := filepath.Join(t.TempDir(), "rules.yml")
	y, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rulesFile, y, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtoolBinary(t), "check", "rules", rulesFile)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Errorf("promtool check rules on the rendered PrometheusRule: %v\n%s", err, out)
	}

	var dash *corev1.ConfigMap
	for _, cm := range m.configMaps {
		if cm.Labels["grafana_dashboard"] == "1" {
			dash = cm
		}
	}
	if dash == nil {
		t.Fatal("no ConfigMap labelled grafana_dashboard=1 (the label Grafana's dashboard sidecar loads)")
	}
	file, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/sidecar-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := dash.Data["sidecar-dashboard.json"]; strings.TrimSpace(got) != strings.TrimSpace(string(file)) || !json.Valid([]byte(got)) {
		t.Error("the dashboard ConfigMap does not hold deploy/grafana/sidecar-dashboard.json")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// promtoolBinary is promtool from PATH or Debian's package
// (deploy/prometheus/install.sh); without it the test skips, under CI it
// fails.
func promtoolBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if st, err := os.Stat("/usr/bin/promtool"); err == nil && st.Mode()&0o111 != 0 {
		return "/usr/bin/promtool"
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("promtool is needed in CI: run deploy/prometheus/install.sh")
	}
	t.Skip("promtool is not installed: run deploy/prometheus/install.sh (Debian's prometheus package) to run this test")
	return ""
}

// TestChart_BadValuesFail: values the sidecar cannot run with fail at
// install (helm template runs the same schema and checks as helm install),
// each saying what is wrong.
func TestChart_BadValuesFail(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		set    []string // json:K=V is --set-json K=V
		want   string
	}{
		{"UnknownKey", []string{"one-pod.yaml"}, []string{"replicas=3"}, "additional properties 'replicas' not allowed"},
		{"TypoNested", []string{"one-pod.yaml"}, []string{"nats.urls=nats://x:4222"}, "additional properties 'urls' not allowed"},
		{"ReplicasWithEmbeddedNATS", []string{"one-pod.yaml"}, []string{"replicaCount=3"}, "replicaCount 3 needs an external NATS cluster (nats.url)"},
		{"NATSReplicasWithEmbeddedNATS", []string{"one-pod.yaml"}, []string{"nats.replicas=3"}, "nats.replicas above 1 needs an external NATS cluster (nats.url)"},
		{"NATSReplicasTooMany", []string{"replicated.yaml"}, []string{"nats.replicas=7"}, "/nats/replicas"},
		{"NoAuth", nil, []string{"conductor.url=http://c:8080/api"}, "auth.principals or auth.existingSecret is required"},
		{"NoConductor", nil, []string{"auth.existingSecret=x"}, "conductor.url is required"},
		{"BadMemory", []string{"one-pod.yaml"}, []string{"resources.limits.memory=1.5Gi"}, "/resources/limits/memory': '1.5Gi' does not match"},
		{"MemoryRequestAboveLimit", []string{"one-pod.yaml"}, []string{"resources.requests.memory=3Gi", "resources.limits.memory=2048Mi"}, "resources.requests.memory 3Gi is above resources.limits.memory 2048Mi"},
		{"CPURequestAboveLimit", []string{"one-pod.yaml"}, []string{"resources.requests.cpu=1500m", "resources.limits.cpu=1.2"}, "resources.requests.cpu 1500m is above resources.limits.cpu 1.2"},
		{"ConductorMemoryRequestAboveLimit", []string{"one-pod.yaml"}, []string{"conductor.inPod.resources.requests.memory=3G", "conductor.inPod.resources.limits.memory=2Gi"}, "conductor.inPod.resources.requests.memory 3G is above"},
		{"NegativeCPU", []string{"one-pod.yaml"}, []string{"resources.limits.cpu=-1"}, "/resources/limits/cpu'"},
		{"BadLogLevel", []string{"one-pod.yaml"}, []string{"config.logLevel=verbose"}, "/config/logLevel': value must be one of"},
		{"BadShutdownGrace", []string{"one-pod.yaml"}, []string{"config.shutdownGrace=500ms"}, "/config/shutdownGrace'"},
		{"GraceTooShort", []string{"one-pod.yaml"}, []string{"config.shutdownGrace=2m", "terminationGracePeriodSeconds=120"}, "terminationGracePeriodSeconds 120 is less than"},
		{"ExternalNATSWithoutCredentials", []string{"replicated.yaml"}, []string{"nats.passwordSecret.name="}, "nats.url needs credentials"},
		{"ExtraNotAFlagName", []string{"one-pod.yaml"}, []string{"config.extra.MAX_RUNS=1"}, "'MAX_RUNS' does not match pattern '^SIDECAR_"},
		{"ExtraOverridesChart", []string{"one-pod.yaml"}, []string{"config.extra.SIDECAR_LISTEN=127.0.0.1:8787"}, "config.extra.SIDECAR_LISTEN is set by the chart"},
		{"PrincipalBadHash", []string{"one-pod.yaml"}, []string{"auth.principals[0].tokenSha256=abc"}, "/auth/principals/0/tokenSha256'"},
		{"PrincipalBadRole", []string{"one-pod.yaml"}, []string{"auth.principals[0].roles[0]=root"}, "/auth/principals/0/roles/0': value must be one of"},
		{"PrincipalsAndExistingSecret", []string{"one-pod.yaml"}, []string{"auth.existingSecret=mine"}, "not both"},
		{"PostgresPasswordInURL", []string{"postgres.yaml"}, []string{"store.postgresURL=postgres://u:secret@h:5432/d"}, "holds a password"},
		{"ClientCAWithoutTLS", []string{"one-pod.yaml"}, []string{"tls.clientCASecretName=ca"}, "needs tls.secretName"},
		{"BadNATSURL", []string{"replicated.yaml"}, []string{"nats.url=http://nats:4222"}, "/nats/url': 'http://nats:4222' does not match"},
		{"OTelBadProtocol", []string{"one-pod.yaml"}, []string{"otel.endpoint=http://otel:4318", "otel.protocol=http/json"}, "/otel/protocol': value must be one of"},
		{"OTelBadEndpoint", []string{"one-pod.yaml"}, []string{"otel.endpoint=otel:4317"}, "/otel/endpoint': 'otel:4317' does not match"},
		{"OTelExtraNotOTel", []string{"one-pod.yaml"}, []string{"otel.extra.SIDECAR_X=1"}, "'SIDECAR_X' does not match pattern '^OTEL_"},
		{"OTelExtraOverridesChart", []string{"one-pod.yaml"}, []string{"otel.extra.OTEL_SERVICE_NAME=x"}, "otel.extra.OTEL_SERVICE_NAME is set by the chart"},
		{"AdoptWithoutProxy", []string{"one-pod.yaml"}, []string{"taskProxy.adopt={orders}"}, "taskProxy.adopt needs taskProxy.enabled"},
		{"ProxyWithoutTokens", []string{"one-pod.yaml"}, []string{"taskProxy.enabled=true"}, "taskProxy.enabled needs taskProxy.tokenSecret.name"},
		{"ExtraURLWithPassword", []string{"postgres.yaml"}, []string{"config.extra.SIDECAR_RETENTION_STORE=postgres://r:pw@h:5432/d"}, "config.extra.SIDECAR_RETENTION_STORE holds a password"},
		{"PDBBlocksEveryEviction", []string{"replicated.yaml"}, []string{"podDisruptionBudget.minAvailable=3"}, "podDisruptionBudget.minAvailable 3 is not below replicaCount 3"},
		{"ExtraSecretLooking", []string{"one-pod.yaml"}, []string{"config.extra.SIDECAR_NATS_PASSWORD=pw"}, "config.extra.SIDECAR_NATS_PASSWORD looks like a secret"},
		{"AdoptBadVersion", []string{"replicated.yaml"}, []string{"taskProxy.adopt={orders:0}"}, "/taskProxy/adopt/0'"},
		{"AdoptBadFailurePolicy", []string{"replicated.yaml"}, []string{"taskProxy.adopt={orders}", "taskProxy.adoptOnStepFailure=retry"}, "/taskProxy/adoptOnStepFailure'"},
		{"ConductorNoCalls", []string{"one-pod.yaml"}, []string{"conductor.maxConcurrentCalls=0"}, "/conductor/maxConcurrentCalls'"},
		{"ProxyTooFewUpstreamConnections", []string{"replicated.yaml"}, []string{"taskProxy.maxUpstreamConnections=1"}, "/taskProxy/maxUpstreamConnections'"},
		{"AdoptBadInterval", []string{"replicated.yaml"}, []string{"taskProxy.adopt={orders}", "taskProxy.adoptInterval=soon"}, "/taskProxy/adoptInterval'"},
		{"RetentionWithoutArchive", []string{"one-pod.yaml"}, []string{"retention.finished=720h"}, "retention.finished needs retention.archive"},
		{"RetentionArchiveWithoutFinished", []string{"one-pod.yaml"}, []string{"retention.archive=s3://b/p"}, "need retention.finished"},
		{"RetentionBadArchive", []string{"one-pod.yaml"}, []string{"retention.finished=720h", "retention.archive=/var/archive"}, "/retention/archive'"},
		{"RetentionPostgresWithoutStore", []string{"postgres.yaml"}, []string{"retention.finished=720h", "retention.archive=s3://b/p"}, "needs retention.store"},
		{"RetentionStoreOnNATS", []string{"one-pod.yaml"}, []string{"retention.finished=720h", "retention.archive=s3://b/p", "retention.store=postgres://r@h:5432/d"}, "retention.store is for store.postgresURL"},
		{"RetentionStorePassword", []string{"postgres.yaml"}, []string{"retention.finished=720h", "retention.archive=s3://b/p", "retention.store=postgres://r:pw@h:5432/d"}, "retention.store holds a password"},
		{"RetentionStoreWithoutPassfile", []string{"postgres.yaml"}, []string{"retention.finished=720h", "retention.archive=s3://b/p", "retention.store=postgres://r@h:5432/d"}, "retention.store needs retention.passfileSecret"},
		{"RetentionPassfileAndPGPASSWORD", []string{"postgres.yaml"}, []string{"retention.finished=720h", "retention.archive=s3://b/p", "retention.store=postgres://r@h:5432/d", "retention.passfileSecret.name=pgpass"}, "retention.passfileSecret replaces store.passwordSecret"},
		{"PrincipalEmptyScopeField", []string{"one-pod.yaml"}, []string{"auth.principals[0].scope.tenantId="}, "/auth/principals/0/scope/tenantId'"},
		{"PrincipalEmptyScope", []string{"one-pod.yaml"}, []string{"json:auth.principals[0].scope={}"}, "/auth/principals/0/scope'"},
		{"PrincipalNameTwice", []string{"one-pod.yaml"}, []string{"auth.principals[1].name=replace-me", "auth.principals[1].certCommonName=ops", "auth.principals[1].roles={viewer}"}, "auth.principals: the name replace-me is given twice"},
		{"PrincipalTokenTwice", []string{"one-pod.yaml"}, []string{"auth.principals[1].name=other", "auth.principals[1].tokenSha256=3f0a1d0c9e6b7f2a4c5d8e9f00112233445566778899aabbccddeeff00112233", "auth.principals[1].roles={viewer}"}, "auth.principals: the tokenSha256 3f0a1d0c9e6b7f2a4c5d8e9f00112233445566778899aabbccddeeff00112233 is given twice"},
		{"PrincipalCertTwice", []string{"one-pod.yaml"}, []string{"auth.principals[1].name=a", "auth.principals[1].certCommonName=ops", "auth.principals[1].roles={viewer}", "auth.principals[2].name=b", "auth.principals[2].certCommonName=ops", "auth.principals[2].roles={admin}"}, "auth.principals: the certCommonName ops is given twice"},
		{"ConductorURLPassword", []string{"one-pod.yaml"}, []string{"conductor.url=http://u:secret@conductor:8080/api"}, "conductor.url holds a password"},
		{"ConductorURLAndSecret", []string{"one-pod.yaml"}, []string{"conductor.urlSecret.name=conductor-url"}, "conductor.urlSecret names Conductor's URL"},
		{"ExtraOverridesChartLogLevel", []string{"one-pod.yaml"}, []string{"config.extra.SIDECAR_LOG_LEVEL=debug"}, "config.extra.SIDECAR_LOG_LEVEL is set by the chart"},
		{"ExtraOverridesChartSyncInterval", []string{"one-pod.yaml"}, []string{"config.extra.SIDECAR_SYNC_INTERVAL=1s"}, "config.extra.SIDECAR_SYNC_INTERVAL is set by the chart"},
		{"RetentionExternalNATSWithoutPassword", []string{"replicated.yaml"}, []string{"retention.finished=720h", "retention.archive=s3://b/p"}, "needs retention.natsPasswordSecret"},
		// A file:// archive off the pod's data volume would be written to
		// the read-only root file system, or to /tmp, which goes with the pod.
		{"RetentionFileArchiveOffTheVolume", []string{"one-pod.yaml"}, []string{"retention.finished=720h", "retention.archive=file:///tmp/archive"}, "file:///var/lib/sidecar/"},
		{"RetentionFileArchiveWithoutAVolume", []string{"replicated.yaml"}, []string{"retention.finished=720h", "retention.archive=file:///var/lib/sidecar/archive", "retention.natsPasswordSecret.name=nats-retention"}, "use s3://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			for _, s := range tc.set {
				if v, ok := strings.CutPrefix(s, "json:"); ok {
					extra = append(extra, "--set-json", v)
				} else {
					extra = append(extra, "--set", s)
				}
			}
			out, err := template(t, tc.values, extra...)
			if err == nil {
				t.Fatalf("helm template succeeded, want a failure mentioning %q:\n%.2000s", tc.want, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template failed without mentioning %q: %v", tc.want, err)
			}
		})
	}
}

// TestChart_TokensFileServeTakes: the tokens file the chart writes from
// auth.principals is one serve loads (its own loader), for every
// documented values file and for principals of each kind: a chart that
// renders a file serve refuses makes a pod that never starts.
func TestChart_TokensFileServeTakes(t *testing.T) {
	principals := `[{"name":"all","tokenSha256":"` + strings.Repeat("a", 64) + `","roles":["admin"]},
		{"name":"acme","tokenSha256":"` + strings.Repeat("b", 64) + `","roles":["operator","viewer"],"scope":{"tenantId":"acme"}},
		{"name":"acme-prod","tokenSha256":"` + strings.Repeat("c", 64) + `","roles":["viewer"],"scope":{"tenantId":"acme","environmentId":"prod"}},
		{"name":"mtls","certCommonName":"ops.example","roles":["viewer"],"scope":{"projectId":"p"}}]`
	cases := []struct {
		name   string
		values []string
		extra  []string
		want   int
	}{{"EveryKind", []string{"one-pod.yaml"}, []string{"--set-json", "auth.principals=" + principals}, 4}}
	for _, r := range renders {
		cases = append(cases, struct {
			name   string
			values []string
			extra  []string
			want   int
		}{r.name, r.values, nil, 0})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := template(t, tc.values, tc.extra...)
			if err != nil {
				t.Fatal(err)
			}
			var tokens string
			for _, sec := range decodeRender(t, out).secrets {
				if f, ok := sec.StringData["tokens.yaml"]; ok {
					tokens = f
				}
			}
			if tokens == "" {
				t.Skip("the values name a Secret of their own (auth.existingSecret)")
			}
			path := filepath.Join(t.TempDir(), "tokens.yaml")
			if err := os.WriteFile(path, []byte(tokens), 0o600); err != nil {
				t.Fatal(err)
			}
			creds, err := httpapi.LoadCredentials(path)
			if err != nil {
				t.Fatalf("serve refuses the chart's tokens file:\n%s\n%v", tokens, err)
			}
			if tc.want > 0 && creds.Len() != tc.want {
				t.Fatalf("%d principals loaded, want %d:\n%s", creds.Len(), tc.want, tokens)
			}
		})
	}
}

// TestChart_ConductorURLSecret: with conductor.urlSecret, Conductor's URL
// (with its credentials) comes from that Secret and is in no ConfigMap.
func TestChart_ConductorURLSecret(t *testing.T) {
	out, err := template(t, []string{"replicated.yaml"}, "--set", "conductor.url=", "--set", "conductor.urlSecret.name=conductor-url")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeRender(t, out)
	c := container(t, the(t, "Deployments", m.deployments), "sidecar")
	if cm := sidecarConfigMap(t, m, c); cm.Data["SIDECAR_CONDUCTOR_URL"] != "" {
		t.Fatalf("the ConfigMap holds SIDECAR_CONDUCTOR_URL %q", cm.Data["SIDECAR_CONDUCTOR_URL"])
	}
	var ref *corev1.SecretKeySelector
	for _, e := range c.Env {
		if e.Name == "SIDECAR_CONDUCTOR_URL" && e.ValueFrom != nil {
			ref = e.ValueFrom.SecretKeyRef
		}
	}
	if ref == nil || ref.Name != "conductor-url" || ref.Key != "url" {
		t.Fatalf("SIDECAR_CONDUCTOR_URL from %+v, want the Secret conductor-url, key url", ref)
	}
}

// TestChart_GoMemLimit: GOMEMLIMIT is goMemLimitPercent of the memory
// limit, whatever its unit, and unset without either.
func TestChart_GoMemLimit(t *testing.T) {
	for _, tc := range []struct {
		set  []string // --set-string for quantities, --set for numbers and null
		want string
	}{
		{nil, "921MiB"}, // 1Gi
		{[]string{"--set-string", "resources.limits.memory=512Mi"}, "460MiB"},
		{[]string{"--set-string", "resources.limits.memory=2G"}, "1716MiB"},
		{[]string{"--set-string", "resources.limits.memory=4294967296"}, "3686MiB"},
		{[]string{"--set", "goMemLimitPercent=80"}, "819MiB"},
		{[]string{"--set", "goMemLimitPercent=0"}, ""},
		{[]string{"--set", "resources.limits=null"}, ""},
	} {
		t.Run(strings.Join(tc.set, " "), func(t *testing.T) {
			extra := tc.set
			out, err := template(t, []string{"one-pod.yaml"}, extra...)
			if err != nil {
				t.Fatal(err)
			}
			c := container(t, the(t, "Deployments", decodeRender(t, out).deployments), "sidecar")
			got := ""
			for _, e := range c.Env {
				if e.Name == "GOMEMLIMIT" {
					got = e.Value
				}
			}
			if got != tc.want {
				t.Errorf("GOMEMLIMIT %q, want %q", got, tc.want)
			}
		})
	}
}

// TestChart_OTel: otel.endpoint turns tracing on with the standard OTEL_*
// variables (the headers from a Secret, never a value); without it no
// OTEL_* variable is set and serve does not trace.
func TestChart_OTel(t *testing.T) {
	env := func(t *testing.T, extra ...string) map[string]corev1.EnvVar {
		t.Helper()
		out, err := template(t, []string{"one-pod.yaml"}, extra...)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]corev1.EnvVar{}
		for _, e := range container(t, the(t, "Deployments", decodeRender(t, out).deployments), "sidecar").Env {
			if strings.HasPrefix(e.Name, "OTEL_") {
				m[e.Name] = e
			}
		}
		return m
	}
	t.Run("Off", func(t *testing.T) {
		if got := env(t); len(got) != 0 {
			t.Fatalf("OTEL_* set without otel.endpoint: %v", got)
		}
	})
	t.Run("On", func(t *testing.T) {
		got := env(t, "--set", "otel.endpoint=http://otel-collector.observability:4317", "--set", "otel.protocol=grpc",
			"--set", "otel.serviceName=sidecar-prod", "--set", "otel.headersSecret.name=otel-auth",
			"--set", "otel.extra.OTEL_TRACES_SAMPLER=parentbased_traceidratio", "--set-string", "otel.extra.OTEL_TRACES_SAMPLER_ARG=0.1")
		for name, want := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4317",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "sidecar-prod",
			"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"} {
			if got[name].Value != want {
				t.Errorf("%s = %q, want %q", name, got[name].Value, want)
			}
		}
		h := got["OTEL_EXPORTER_OTLP_HEADERS"]
		if h.Value != "" || h.ValueFrom == nil || h.ValueFrom.SecretKeyRef == nil ||
			h.ValueFrom.SecretKeyRef.Name != "otel-auth" || h.ValueFrom.SecretKeyRef.Key != "headers" {
			t.Errorf("OTEL_EXPORTER_OTLP_HEADERS %+v, want from Secret otel-auth, key headers", h)
		}
		if len(got) != 6 {
			t.Errorf("got %d OTEL_* variables, want 6: %v", len(got), got)
		}
	})
}

// TestChart_GeneratedFiles: what is generated from the chart or for it is
// current: the plain manifests (helm template of the documented values
// files), the chart's copies of the alert rules and the dashboard, and the
// values reference in docs/helm.md. go test -run TestChart_GeneratedFiles
// -update (deploy/helm/generate.sh) rewrites them.
func TestChart_GeneratedFiles(t *testing.T) {
	type gen struct {
		path string
		want []byte
	}
	var files []gen
	for _, r := range renders {
		if r.plain == "" {
			continue
		}
		out, err := template(t, r.values)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, v := range r.values {
			names = append(names, "deploy/helm/examples/"+v)
		}
		header := "# Generated from the Helm chart deploy/helm/conductor-sidecar with\n# " +
			strings.Join(names, ", ") + " by deploy/helm/generate.sh.\n" +
			"# Edit the chart or the values file, not this file. `kubectl apply -f` it, or\n" +
			"# install the chart with the same values: helm install sidecar deploy/helm/conductor-sidecar -f " +
			names[0] + "\n"
		files = append(files, gen{r.plain, []byte(header + out)})
	}
	for src, dst := range map[string]string{
		"deploy/prometheus/alerts.yml":          "files/alerts.yml",
		"deploy/grafana/sidecar-dashboard.json": "files/sidecar-dashboard.json",
	} {
		b, err := os.ReadFile(filepath.Join(repoRoot, src))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, gen{filepath.Join(chartDir, dst), b})
	}
	docPath := filepath.Join(repoRoot, "docs/helm.md")
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := valuesReference(filepath.Join(chartDir, "values.schema.json"), filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	newDoc, err := replaceBetween(string(doc), refBegin, refEnd, ref)
	if err != nil {
		t.Fatalf("docs/helm.md: %v", err)
	}
	files = append(files, gen{docPath, []byte(newDoc)})

	for _, f := range files {
		got, _ := os.ReadFile(f.path)
		if bytes.Equal(got, f.want) {
			continue
		}
		if *update {
			if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f.path, f.want, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("rewrote %s", f.path)
			continue
		}
		t.Errorf("%s is not current: run deploy/helm/generate.sh", f.path)
	}
}

// replaceBetween replaces what is between the lines begin and end of doc.
func replaceBetween(doc, begin, end, body string) (string, error) {
	i := strings.Index(doc, begin+"\n")
	j := strings.Index(doc, end+"\n")
	if i < 0 || j < i {
		return "", fmt.Errorf("want the lines %q and %q", begin, end)
	}
	return doc[:i+len(begin)+1] + body + doc[j:], nil
}

// fmtSeconds is a grace period, or "unset".
func fmtSeconds(p *int64) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprintf("%ds", *p)
}

// sidecarConfigMap is the ConfigMap the sidecar container takes its
// variables from.
func sidecarConfigMap(t *testing.T, m *manifests, c *corev1.Container) *corev1.ConfigMap {
	t.Helper()
	for _, x := range m.configMaps {
		if x.Name == c.EnvFrom[0].ConfigMapRef.Name {
			return x
		}
	}
	t.Fatal("no ConfigMap of the sidecar's")
	return nil
}

// TestChart_NATSTLS: nats.tls.secretName gives serve the CA of the
// external cluster, and with clientCert its client certificate and key,
// each variable a file of the Secret's read-only mount (0440).
func TestChart_NATSTLS(t *testing.T) {
	for _, clientCert := range []bool{false, true} {
		out, err := template(t, []string{"replicated.yaml"}, "--set", "nats.tls.secretName=nats-tls", "--set", fmt.Sprintf("nats.tls.clientCert=%v", clientCert))
		if err != nil {
			t.Fatal(err)
		}
		m := decodeRender(t, out)
		d := the(t, "Deployments", m.deployments)
		c := container(t, d, "sidecar")
		cm := sidecarConfigMap(t, m, c)
		checkSecretModes(t, d)
		vi := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "nats-tls" })
		if vi < 0 {
			t.Fatal("no volume of the Secret nats-tls")
		}
		vol := d.Spec.Template.Spec.Volumes[vi]
		mi := slices.IndexFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.Name == vol.Name })
		if mi < 0 || !c.VolumeMounts[mi].ReadOnly {
			t.Fatalf("the Secret nats-tls is not mounted read-only: %+v", c.VolumeMounts)
		}
		want := map[string]string{"SIDECAR_NATS_CA": "ca.crt"}
		if clientCert {
			want["SIDECAR_NATS_CERT"], want["SIDECAR_NATS_KEY"] = "tls.crt", "tls.key"
		}
		for _, k := range []string{"SIDECAR_NATS_CA", "SIDECAR_NATS_CERT", "SIDECAR_NATS_KEY"} {
			item, wanted := want[k]
			switch {
			case !wanted && cm.Data[k] != "":
				t.Errorf("clientCert=%v: %s = %q, want none", clientCert, k, cm.Data[k])
			case wanted && (cm.Data[k] != c.VolumeMounts[mi].MountPath+"/"+item || !slices.ContainsFunc(vol.Secret.Items, func(i corev1.KeyToPath) bool { return i.Key == item && i.Path == item })):
				t.Errorf("clientCert=%v: %s = %q is not the mounted %s of the Secret: %+v", clientCert, k, cm.Data[k], item, vol.Secret.Items)
			case wanted && !flags.isFlag(k):
				t.Errorf("%s is no flag of sidecar serve", k)
			}
		}
		if len(vol.Secret.Items) != len(want) {
			t.Errorf("clientCert=%v: the volume holds %+v, want %d files", clientCert, vol.Secret.Items, len(want))
		}
	}
}

// TestChart_Console: console.secureCookie and console.hosts reach serve
// as its flags' variables (off and empty by default).
func TestChart_Console(t *testing.T) {
	for _, c := range []struct {
		set    []string
		cookie string
		hosts  string
	}{
		{nil, "", ""},
		{[]string{"console.secureCookie=true", "console.hosts={sidecar.example.com,ops.example.com}"}, "true", "sidecar.example.com,ops.example.com"},
	} {
		var extra []string
		for _, s := range c.set {
			extra = append(extra, "--set", s)
		}
		out, err := template(t, []string{"one-pod.yaml"}, extra...)
		if err != nil {
			t.Fatal(err)
		}
		m := decodeRender(t, out)
		cm := sidecarConfigMap(t, m, container(t, the(t, "Deployments", m.deployments), "sidecar"))
		if cm.Data["SIDECAR_CONSOLE_SECURE_COOKIE"] != c.cookie || cm.Data["SIDECAR_API_ALLOWED_HOSTS"] != c.hosts {
			t.Errorf("%v: SIDECAR_CONSOLE_SECURE_COOKIE %q, SIDECAR_API_ALLOWED_HOSTS %q; want %q, %q", c.set,
				cm.Data["SIDECAR_CONSOLE_SECURE_COOKIE"], cm.Data["SIDECAR_API_ALLOWED_HOSTS"], c.cookie, c.hosts)
		}
		for key := range cm.Data {
			if !flags.isFlag(key) {
				t.Errorf("ConfigMap key %s is no flag of sidecar serve", key)
			}
		}
	}
	if _, err := template(t, []string{"one-pod.yaml"}, "--set", "console.hosts={bad host}"); err == nil {
		t.Error("a host name with a space rendered")
	}
}
