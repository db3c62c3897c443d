package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifests is every object of a set of YAML files or of a chart render,
// decoded strictly.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	claims      []*corev1.PersistentVolumeClaim
	secrets     []*corev1.Secret
	budgets     []*policyv1.PodDisruptionBudget
	policies    []*networkingv1.NetworkPolicy
	// The Prometheus Operator's kinds, which only a chart render with
	// its values for them holds.
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
	text            map[string]string // file -> raw text
}

// decodeStrict decodes one YAML document into the API type its apiVersion
// and kind name. Unknown and duplicate fields are errors, and so is a kind
// this test does not know.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/PersistentVolumeClaim":
		obj = &corev1.PersistentVolumeClaim{}
	case "v1/Secret":
		obj = &corev1.Secret{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		obj = &monitoringv1.PrometheusRule{}
	default:
		return nil, fmt.Errorf("unknown apiVersion/kind %q/%q", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// splitDocuments returns the non-empty YAML documents of data.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return nil, err
		}
		if v != nil { // only comments
			docs = append(docs, doc)
		}
	}
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	return loadManifestsIn(t, ".")
}

// loadManifestsIn is every object in dir/*.yaml, decoded strictly.
func loadManifestsIn(t *testing.T, dir string) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no *.yaml in deploy/kubernetes/%s", dir)
	}
	m := &manifests{text: map[string]string{}}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m.text[file] = string(data)
		docs, err := splitDocuments(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for i, doc := range docs {
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Fatalf("%s, document %d: %v", file, i+1, err)
			}
			m.add(obj)
		}
	}
	return m
}

// add files a decoded object under its kind.
func (m *manifests) add(obj any) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		m.deployments = append(m.deployments, o)
	case *corev1.Service:
		m.services = append(m.services, o)
	case *corev1.ConfigMap:
		m.configMaps = append(m.configMaps, o)
	case *corev1.PersistentVolumeClaim:
		m.claims = append(m.claims, o)
	case *corev1.Secret:
		m.secrets = append(m.secrets, o)
	case *policyv1.PodDisruptionBudget:
		m.budgets = append(m.budgets, o)
	case *networkingv1.NetworkPolicy:
		m.policies = append(m.policies, o)
	case *monitoringv1.ServiceMonitor:
		m.serviceMonitors = append(m.serviceMonitors, o)
	case *monitoringv1.PrometheusRule:
		m.rules = append(m.rules, o)
	}
}

// the returns the only element of s.
func the[T any](t *testing.T, what string, s []T) T {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("got %d %s, want 1", len(s), what)
	}
	return s[0]
}

func container(t *testing.T, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	t.Fatalf("deployment %s has no container %q", d.Name, name)
	return nil
}

// portNumber resolves a probe's or service's port against c's ports.
func portNumber(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, p.StrVal)
	return 0
}

func TestDecodeStrict(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"UnknownField", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  portz: []\n"},
		{"DuplicateField", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {A: \"1\"}\ndata: {B: \"2\"}\n"},
		{"UnknownKind", "apiVersion: v1\nkind: Servise\nmetadata: {name: x}\n"},
		{"WrongAPIVersion", "apiVersion: apps/v1beta1\nkind: Deployment\nmetadata: {name: x}\n"},
		{"MisplacedField", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: a\n          livenessProbe: {path: /healthz}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeStrict([]byte(tc.doc)); err == nil {
				t.Fatal("got no error")
			}
		})
	}
	t.Run("OK", func(t *testing.T) {
		obj, err := decodeStrict([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {A: \"1\"}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := obj.(*corev1.ConfigMap).Data["A"]; got != "1" {
			t.Fatalf("got %q want 1", got)
		}
	})
}

func TestManifests_Decode(t *testing.T) {
	m := loadManifests(t)
	the(t, "Deployments", m.deployments)
	the(t, "Services", m.services)
	the(t, "ConfigMaps", m.configMaps)
	the(t, "PersistentVolumeClaims", m.claims)
	the(t, "NetworkPolicies", m.policies)
}

// TestManifests_EnvVarsAreServeFlags checks every SIDECAR_* name anywhere in
// the manifests, comments included, against `sidecar serve -h`.
func TestManifests_EnvVarsAreServeFlags(t *testing.T) {
	m := loadManifests(t)
	n := 0
	for file, text := range m.text {
		for _, name := range envNamesIn(text) {
			n++
			if !flags.isFlag(name) {
				t.Errorf("%s names %s, which is no flag of sidecar serve", file, name)
			}
		}
	}
	cm := the(t, "ConfigMaps", m.configMaps)
	for key := range cm.Data {
		if !flags.isFlag(key) {
			t.Errorf("ConfigMap key %s is no flag of sidecar serve", key)
		}
	}
	if n == 0 {
		t.Fatal("no SIDECAR_* names found")
	}
}

func TestDeployment_Sidecar(t *testing.T) {
	m := loadManifests(t)
	d := the(t, "Deployments", m.deployments)
	cm := the(t, "ConfigMaps", m.configMaps)
	pod := &d.Spec.Template.Spec
	c := container(t, d, "sidecar")
	env := cm.Data

	t.Run("Listen", func(t *testing.T) {
		host, port, err := net.SplitHostPort(env["SIDECAR_LISTEN"])
		if err != nil {
			t.Fatalf("SIDECAR_LISTEN %q: %v", env["SIDECAR_LISTEN"], err)
		}
		if host != "0.0.0.0" && host != "" {
			t.Errorf("SIDECAR_LISTEN host %q: probes and Prometheus cannot reach it, want 0.0.0.0", host)
		}
		if got, want := port, strconv.Itoa(int(portNumber(t, c, intstr.FromString("http")))); got != want {
			t.Errorf("SIDECAR_LISTEN port %s, container port http %s", got, want)
		}
		if got := portNumber(t, c, intstr.FromString("http")); got != 8787 {
			t.Errorf("container port http: got %d want 8787", got)
		}
	})

	t.Run("Probes", func(t *testing.T) {
		for _, p := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}, {"startup", c.StartupProbe, "/healthz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s probe: want an httpGet", p.name)
				continue
			}
			if got := p.probe.HTTPGet.Path; got != p.path {
				t.Errorf("%s probe path: got %q want %q", p.name, got, p.path)
			}
			if got := portNumber(t, c, p.probe.HTTPGet.Port); got != 8787 {
				t.Errorf("%s probe port: got %d want 8787", p.name, got)
			}
		}
		cd := container(t, d, "conductor")
		for name, probe := range map[string]*corev1.Probe{"liveness": cd.LivenessProbe, "readiness": cd.ReadinessProbe, "startup": cd.StartupProbe} {
			if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/health" || portNumber(t, cd, probe.HTTPGet.Port) != 8080 {
				t.Errorf("conductor %s probe: want httpGet /health on 8080, got %+v", name, probe)
			}
		}
	})

	t.Run("Config", func(t *testing.T) {
		if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
			return e.ConfigMapRef != nil && e.ConfigMapRef.Name == cm.Name
		}) {
			t.Errorf("sidecar container does not take its env from ConfigMap %s", cm.Name)
		}
		if got, want := env["SIDECAR_CONDUCTOR_URL"], "http://localhost:8080/api"; got != want {
			t.Errorf("SIDECAR_CONDUCTOR_URL: got %q want %q", got, want)
		}
		if _, err := time.ParseDuration(env["SIDECAR_DRAIN_TIMEOUT"]); err != nil {
			t.Errorf("SIDECAR_DRAIN_TIMEOUT: %v", err)
		}
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "SIDECAR_WORKER_ID" })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.name" {
			t.Errorf("SIDECAR_WORKER_ID must come from the pod name (downward API)")
		}
		if _, ok := env["SIDECAR_WORKER_ID"]; ok {
			t.Errorf("SIDECAR_WORKER_ID in the ConfigMap would give every replica the same id")
		}
	})

	t.Run("DataVolume", func(t *testing.T) {
		dataDir := env["SIDECAR_DATA_DIR"]
		claim := the(t, "PersistentVolumeClaims", m.claims)
		i := slices.IndexFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == dataDir })
		if i < 0 {
			t.Fatalf("SIDECAR_DATA_DIR %q is not a volume mount of the sidecar", dataDir)
		}
		j := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
		if j < 0 || pod.Volumes[j].PersistentVolumeClaim == nil || pod.Volumes[j].PersistentVolumeClaim.ClaimName != claim.Name {
			t.Errorf("the data dir must be on PersistentVolumeClaim %s", claim.Name)
		}
		if c.VolumeMounts[i].ReadOnly {
			t.Error("the data dir is mounted read-only")
		}
	})

	t.Run("TokensFile", func(t *testing.T) {
		// Off loopback serve refuses to start without authentication: the
		// tokens file must be a key of the mounted Secret.
		path := env["SIDECAR_TOKENS_FILE"]
		if path == "" {
			t.Fatal("SIDECAR_LISTEN is off loopback and SIDECAR_TOKENS_FILE is not set: serve would refuse to start")
		}
		secret := the(t, "Secrets", m.secrets)
		dir, key := filepath.Dir(path), filepath.Base(path)
		i := slices.IndexFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == dir })
		if i < 0 {
			t.Fatalf("SIDECAR_TOKENS_FILE %q is not in a volume mount of the sidecar", path)
		}
		j := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
		if j < 0 || pod.Volumes[j].Secret == nil || pod.Volumes[j].Secret.SecretName != secret.Name {
			t.Fatalf("the tokens file must come from Secret %s", secret.Name)
		}
		if _, ok := secret.StringData[key]; !ok {
			t.Errorf("Secret %s has no key %s", secret.Name, key)
		}
		if !c.VolumeMounts[i].ReadOnly {
			t.Error("the tokens mount is writable")
		}
	})

	t.Run("OneReplicaWithEmbeddedNATS", func(t *testing.T) {
		if _, external := env["SIDECAR_NATS_URL"]; external {
			t.Skip("external NATS: several replicas allowed")
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("replicas: want 1 with the embedded NATS server")
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("strategy %q: want Recreate, a rolling update starts a second sidecar on the same store", d.Spec.Strategy.Type)
		}
	})

	t.Run("ShutdownBudget", func(t *testing.T) {
		grace := flags.shutdownGrace(t, env["SIDECAR_SHUTDOWN_GRACE"])
		if pod.TerminationGracePeriodSeconds == nil {
			t.Fatal("terminationGracePeriodSeconds unset (default 30s)")
		}
		got := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
		if got < grace+stopBudget {
			t.Errorf("terminationGracePeriodSeconds %v: want >= shutdown grace %v + %v", got, grace, stopBudget)
		}
	})

	t.Run("Image", func(t *testing.T) {
		// deploy/image builds it: its DefaultRepository and UID.
		if !strings.HasPrefix(c.Image, "ghcr.io/conductor-sidecar/sidecar:") {
			t.Errorf("image %q: want ghcr.io/conductor-sidecar/sidecar:<version> (deploy/image)", c.Image)
		}
		if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
			t.Error("runAsUser: want 65532, the image's user (deploy/image)")
		}
	})

	t.Run("MemoryLimit", func(t *testing.T) {
		// GOMEMLIMIT (Go's syntax: a byte count or B/KiB/MiB/GiB/TiB)
		// between 80% and 95% of the container's memory limit.
		var value string
		for _, e := range c.Env {
			if e.Name == "GOMEMLIMIT" {
				value = e.Value
			}
		}
		if value == "" {
			t.Fatal("GOMEMLIMIT unset: the Go heap may grow to the container limit and be OOM-killed")
		}
		// Kubernetes spells 900MiB as 900Mi, and 900B as 900.
		q, err := resource.ParseQuantity(strings.TrimSuffix(value, "B"))
		if err != nil {
			t.Fatalf("GOMEMLIMIT %q: %v", value, err)
		}
		limit := c.Resources.Limits.Memory()
		if got, lo, hi := q.Value(), limit.Value()*80/100, limit.Value()*95/100; got < lo || got > hi {
			t.Errorf("GOMEMLIMIT %s = %d bytes: want 80%%-95%% of the memory limit %s (%d-%d)", value, got, limit, lo, hi)
		}
	})

	t.Run("SecurityContext", func(t *testing.T) {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Error("sidecar: want runAsNonRoot")
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Error("sidecar: want readOnlyRootFilesystem")
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("sidecar: want allowPrivilegeEscalation false")
		}
		for _, ct := range pod.Containers {
			if ct.Resources.Requests.Memory().IsZero() || ct.Resources.Limits.Memory().IsZero() || ct.Resources.Requests.Cpu().IsZero() {
				t.Errorf("%s: want memory requests and limits and a cpu request", ct.Name)
			}
		}
	})
}

func TestService(t *testing.T) {
	m := loadManifests(t)
	d := the(t, "Deployments", m.deployments)
	s := the(t, "Services", m.services)
	c := container(t, d, "sidecar")
	i := slices.IndexFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "http" })
	if i < 0 {
		t.Fatal("service has no port named http")
	}
	if got := s.Spec.Ports[i].Port; got != 8787 {
		t.Errorf("service port http: got %d want 8787", got)
	}
	if got := portNumber(t, c, s.Spec.Ports[i].TargetPort); got != 8787 {
		t.Errorf("service targetPort resolves to %d, want 8787", got)
	}
	labels := d.Spec.Template.Labels
	for k, v := range s.Spec.Selector {
		if labels[k] != v {
			t.Errorf("service selector %s=%s does not match the pod labels %v", k, v, labels)
		}
	}
	sel, err := metav1.LabelSelectorAsMap(d.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("deployment selector %s=%s does not match its pod labels", k, v)
		}
	}
}

// TestReplicated: the set in replicated/ runs three sidecars on an
// external NATS cluster with three replicas per stream, keeps two of them
// up through voluntary disruptions, and keeps the base's pod hardening.
func TestReplicated(t *testing.T) {
	m := loadManifestsIn(t, "replicated")
	d := the(t, "Deployments", m.deployments)
	cm := the(t, "ConfigMaps", m.configMaps)
	pdb := the(t, "PodDisruptionBudgets", m.budgets)
	c := container(t, d, "sidecar")
	env := cm.Data
	for file, text := range m.text {
		for _, name := range envNamesIn(text) {
			if !flags.isFlag(name) {
				t.Errorf("%s names %s, which is no flag of sidecar serve", file, name)
			}
		}
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", d.Spec.Replicas)
	}
	if env["SIDECAR_NATS_URL"] == "" || strings.Count(env["SIDECAR_NATS_URL"], "nats://") != 3 {
		t.Errorf("SIDECAR_NATS_URL %q: want the three nodes of a cluster", env["SIDECAR_NATS_URL"])
	}
	if env["SIDECAR_NATS_REPLICAS"] != "3" {
		t.Errorf("SIDECAR_NATS_REPLICAS %q, want 3", env["SIDECAR_NATS_REPLICAS"])
	}
	// The pods start together and each waits for the NATS cluster for at
	// most SIDECAR_NATS_START_TIMEOUT: that must end before the startup
	// probe gives the pod up, or the kubelet kills a start that would
	// have succeeded.
	wait, err := time.ParseDuration(env["SIDECAR_NATS_START_TIMEOUT"])
	if err != nil || wait <= 0 {
		t.Errorf("SIDECAR_NATS_START_TIMEOUT %q: want a positive duration (%v)", env["SIDECAR_NATS_START_TIMEOUT"], err)
	}
	if p := c.StartupProbe; p == nil || time.Duration(p.PeriodSeconds*p.FailureThreshold)*time.Second <= wait {
		t.Errorf("the startup probe must allow more than SIDECAR_NATS_START_TIMEOUT %s: %+v", wait, p)
	}
	if len(m.claims) != 0 {
		t.Error("a PersistentVolumeClaim: the log is in the NATS cluster, replicas share no volume")
	}
	// Credentials: a non-loopback NATS URL needs them, from a mounted Secret.
	mounted := false
	for _, vm := range c.VolumeMounts {
		if env["SIDECAR_NATS_PASSWORD_FILE"] != "" && filepath.Dir(env["SIDECAR_NATS_PASSWORD_FILE"]) == vm.MountPath {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("SIDECAR_NATS_PASSWORD_FILE %q is not in a mounted volume", env["SIDECAR_NATS_PASSWORD_FILE"])
	}
	if got := envFromPodName(c); !got {
		t.Error("SIDECAR_WORKER_ID must come from the pod name: one id per replica")
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("PodDisruptionBudget minAvailable %v, want 2 of 3", pdb.Spec.MinAvailable)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the PodDisruptionBudget's selector %v does not select the pods %v (%v)", pdb.Spec.Selector, d.Spec.Template.Labels, err)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the sidecar container must run as 65532 on a read-only root, as in the base")
	}
	if ps := d.Spec.Template.Spec.SecurityContext; ps == nil || ps.FSGroup == nil || *ps.FSGroup != 65532 {
		t.Error("fsGroup 65532: the Secret volumes must be readable by the sidecar's group")
	}
}

// envFromPodName reports whether c's SIDECAR_WORKER_ID is the pod's name.
func envFromPodName(c *corev1.Container) bool {
	for _, e := range c.Env {
		if e.Name == "SIDECAR_WORKER_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			return true
		}
	}
	return false
}
