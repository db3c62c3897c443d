package kubernetes

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// scrapeConfigFile is the Prometheus configuration for the cluster; its
// job "sidecar" is what the test runs.
const scrapeConfigFile = "../prometheus/kubernetes.yml"

// TestManifests_PrometheusScrapes checks that a Prometheus configured as
// deploy/prometheus/kubernetes.yml says scrapes a sidecar deployed as the
// manifests say, with up == 1 and the sidecar's metrics, for the one-pod
// set and for the replicated set.
//
// Nothing is assumed about how the sidecar is scraped; everything comes
// from the files:
//   - the targets are what Kubernetes' endpoints discovery gives the job
//     for the sidecar's Service: one per Service port, at the pod's
//     address and the container port the port's targetPort names, with
//     the Service's labels and annotations as __meta_kubernetes_* labels
//     (so the job's relabeling, its port, path, scheme and credentials are
//     the file's, unchanged);
//   - `sidecar serve` runs with the pod's environment: the ConfigMap and
//     the container's env, the Secret volumes as files with the mode the
//     kubelet gives them (defaultMode, plus 0440 with an fsGroup), so the
//     tokens file turns authentication on as in the pod.
//
// The pod's address is a random address of 127.0.0.0/8, so the manifests'
// own ports are used without colliding with anything on 127.0.0.1; a
// listener the manifests put on 0.0.0.0 is put on that address. What a
// single machine cannot have is replaced and logged: the data dir (a
// temporary one), an external NATS cluster (the embedded server instead),
// Conductor (SIDECAR_TEST_CONDUCTOR_URL with a task domain of the test's
// own, or an address where nothing listens).
func TestManifests_PrometheusScrapes(t *testing.T) {
	promBin := prometheusBinary(t)
	base := loadManifests(t)
	for _, tc := range []struct {
		name string
		m    *manifests
	}{
		{"OnePod", base},
		{"Replicated", loadManifestsIn(t, "replicated")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := the(t, "Deployments", tc.m.deployments)
			cm := the(t, "ConfigMaps", tc.m.configMaps)
			svc := the(t, "Services", tc.m.services)
			c := container(t, d, "sidecar")
			pod := newFakePod(t, d, c)

			api := startServe(t, pod, d, c, cm, tc.m.secrets)
			targets := serviceTargets(t, svc, d, c, pod)
			prom := startPrometheus(t, promBin, renderScrapeConfig(t, targets))

			target := prom.waitScraped(t)
			if target.Health != "up" {
				t.Fatalf("Prometheus scrapes %s: health %s, last error %q (want up: the scrape has no credential the API would accept, so it must reach a listener that needs none)",
					target.ScrapeURL, target.Health, target.LastError)
			}
			waitUntil(t, "the sidecar's metrics in Prometheus", 2*time.Minute, func() bool {
				res, err := prom.query(`count({job="sidecar", __name__=~"sidecar_.+"})`)
				return err == nil && len(res) == 1 && res[0].value() >= 20
			})
			res, err := prom.query(`up{job="sidecar"}`)
			if err != nil || len(res) != 1 || res[0].value() != 1 {
				t.Fatalf(`up{job="sidecar"}: %v %v, want one series with value 1 (the job alerts.yml selects)`, res, err)
			}
			t.Logf("Prometheus scraped %s: up{job=\"sidecar\", instance=%q} == 1", target.ScrapeURL, res[0].Metric["instance"])

			// The scrape needed no credential, yet authentication is on:
			// the API itself answers /metrics with 401 without a token.
			resp, err := http.Get("http://" + api + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s/metrics without a token: %s, want 401 (the manifests turn authentication on)", api, resp.Status)
			}
		})
	}
}

// fakePod is the pod the test plays: its name and address.
type fakePod struct {
	name string
	ip   string
}

// newFakePod picks an address of 127.0.0.0/8 on which every port of c is
// free.
func newFakePod(t *testing.T, d *appsv1.Deployment, c *corev1.Container) *fakePod {
	t.Helper()
	for range 50 {
		ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
		free := true
		for _, p := range c.Ports {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(int(p.ContainerPort))))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return &fakePod{name: fmt.Sprintf("%s-%d", d.Name, time.Now().UnixNano()), ip: ip}
		}
	}
	t.Fatal("no address of 127.0.0.0/8 with the container's ports free (is something listening on 0.0.0.0 on them?)")
	return nil
}

// startServe runs `sidecar serve` with the environment the pod's sidecar
// container gets, and returns the API's address once /healthz answers.
func startServe(t *testing.T, pod *fakePod, d *appsv1.Deployment, c *corev1.Container, cm *corev1.ConfigMap, secrets []*corev1.Secret) string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil || from.ConfigMapRef.Name != cm.Name {
			t.Fatalf("envFrom %+v: only the ConfigMap %s is known here", from, cm.Name)
		}
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = pod.name
		default:
			t.Fatalf("env %s: only values and metadata.name are known here", e.Name)
		}
	}

	// The Secret volumes, as the kubelet writes them.
	root := t.TempDir()
	podSpec := &d.Spec.Template.Spec
	for _, vm := range c.VolumeMounts {
		i := slices.IndexFunc(podSpec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 || podSpec.Volumes[i].Secret == nil {
			continue
		}
		vol := podSpec.Volumes[i].Secret
		j := slices.IndexFunc(secrets, func(s *corev1.Secret) bool { return s.Name == vol.SecretName })
		dir := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mode := kubeletSecretMode(vol, podSpec.SecurityContext)
		data := map[string][]byte{}
		if j < 0 {
			// Created by hand (the task proxy's tokens, the NATS
			// password): a stand-in for each file the volume names.
			t.Logf("Secret %s (mounted at %s) is created by hand, not by the manifests: a stand-in", vol.SecretName, vm.MountPath)
			for _, it := range vol.Items {
				data[it.Path] = []byte("stand-in-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "\n")
			}
		} else {
			data = secretData(secrets[j])
		}
		for key, data := range data {
			path := filepath.Join(dir, key)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range env {
			if rest, ok := strings.CutPrefix(v, vm.MountPath+"/"); ok {
				env[k] = filepath.Join(dir, rest)
			}
		}
	}

	// What one machine cannot have.
	env["SIDECAR_DATA_DIR"] = t.TempDir()
	for _, k := range []string{"SIDECAR_NATS_URL", "SIDECAR_NATS_USER", "SIDECAR_NATS_PASSWORD_FILE", "SIDECAR_NATS_REPLICAS"} {
		if v, ok := env[k]; ok {
			t.Logf("%s=%s left out: the embedded NATS server stands in for the cluster", k, v)
			delete(env, k)
		}
	}
	readyPath := "/readyz"
	if u := os.Getenv("SIDECAR_TEST_CONDUCTOR_URL"); u != "" {
		env["SIDECAR_CONDUCTOR_URL"] = u
		// Its workers poll a task domain of their own: tasks of other
		// sidecars on this Conductor never reach it.
		env["SIDECAR_TASK_DOMAIN"] = "scrape" + strconv.FormatInt(time.Now().UnixNano(), 36)
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		env["SIDECAR_CONDUCTOR_URL"] = "http://" + ln.Addr().String() + "/api"
		ln.Close()
		readyPath = "/healthz"
		t.Log("SIDECAR_TEST_CONDUCTOR_URL unset: the sidecar runs without a Conductor")
	}
	for k, v := range env {
		if !strings.HasSuffix(k, "_LISTEN") {
			continue
		}
		host, port, err := net.SplitHostPort(v)
		if err != nil {
			t.Fatalf("%s=%s: %v", k, v, err)
		}
		if host == "0.0.0.0" || host == "" || host == "::" {
			env[k] = net.JoinHostPort(pod.ip, port)
		}
	}
	api := env["SIDECAR_LISTEN"]
	if api == "" {
		t.Fatal("SIDECAR_LISTEN unset")
	}

	cmd := exec.Command(sidecarBin, "serve")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SIDECAR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	startProcess(t, cmd, "sidecar serve")
	waitUntil(t, "the sidecar to answer "+readyPath, 2*time.Minute, func() bool {
		resp, err := http.Get("http://" + api + readyPath)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return api
}

// kubeletSecretMode is the mode the kubelet gives the files of a Secret
// volume: defaultMode (0644 when unset), and with an fsGroup it adds
// group read (it chowns a read-only volume to the group and ORs 0440).
func kubeletSecretMode(vol *corev1.SecretVolumeSource, psc *corev1.PodSecurityContext) os.FileMode {
	mode := os.FileMode(0o644)
	if vol.DefaultMode != nil {
		mode = os.FileMode(*vol.DefaultMode)
	}
	if psc != nil && psc.FSGroup != nil {
		mode |= 0o440
	}
	return mode
}

// secretData is a Secret's keys and values, stringData included.
func secretData(s *corev1.Secret) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range s.Data {
		out[k] = v
	}
	for k, v := range s.StringData {
		out[k] = []byte(v)
	}
	return out
}

// scrapeTarget is one target of a static_config, with its labels.
type scrapeTarget struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// serviceTargets is what Kubernetes' endpoints discovery gives a scrape
// job for svc with one ready pod: a target per Service port, at the pod's
// address and the container port the targetPort resolves to.
func serviceTargets(t *testing.T, svc *corev1.Service, d *appsv1.Deployment, c *corev1.Container, pod *fakePod) []scrapeTarget {
	t.Helper()
	meta := map[string]string{
		"__meta_kubernetes_namespace":                    "default",
		"__meta_kubernetes_service_name":                 svc.Name,
		"__meta_kubernetes_endpoints_name":               svc.Name,
		"__meta_kubernetes_endpoint_ready":               "true",
		"__meta_kubernetes_endpoint_address_target_kind": "Pod",
		"__meta_kubernetes_endpoint_address_target_name": pod.name,
		"__meta_kubernetes_pod_name":                     pod.name,
		"__meta_kubernetes_pod_ip":                       pod.ip,
		"__meta_kubernetes_pod_ready":                    "true",
		"__meta_kubernetes_pod_phase":                    "Running",
		"__meta_kubernetes_pod_container_name":           c.Name,
		"__meta_kubernetes_pod_container_image":          c.Image,
	}
	for k, v := range svc.Labels {
		meta["__meta_kubernetes_service_label_"+sdName(k)] = v
		meta["__meta_kubernetes_service_labelpresent_"+sdName(k)] = "true"
	}
	for k, v := range svc.Annotations {
		meta["__meta_kubernetes_service_annotation_"+sdName(k)] = v
		meta["__meta_kubernetes_service_annotationpresent_"+sdName(k)] = "true"
	}
	for k, v := range d.Spec.Template.Labels {
		meta["__meta_kubernetes_pod_label_"+sdName(k)] = v
		meta["__meta_kubernetes_pod_labelpresent_"+sdName(k)] = "true"
	}
	var out []scrapeTarget
	for _, sp := range svc.Spec.Ports {
		port := sp.TargetPort
		if port == (intstr.IntOrString{}) {
			port = intstr.FromInt32(sp.Port)
		}
		number := portNumber(t, c, port)
		labels := map[string]string{
			"__meta_kubernetes_endpoint_port_name":     sp.Name,
			"__meta_kubernetes_endpoint_port_protocol": string(sp.Protocol),
		}
		for _, cp := range c.Ports {
			if cp.ContainerPort == number {
				labels["__meta_kubernetes_pod_container_port_name"] = cp.Name
				labels["__meta_kubernetes_pod_container_port_number"] = strconv.Itoa(int(cp.ContainerPort))
				labels["__meta_kubernetes_pod_container_port_protocol"] = string(cp.Protocol)
			}
		}
		for k, v := range meta {
			labels[k] = v
		}
		out = append(out, scrapeTarget{Targets: []string{net.JoinHostPort(pod.ip, strconv.Itoa(int(number)))}, Labels: labels})
	}
	return out
}

var sdUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// sdName is a Kubernetes label or annotation name as service discovery
// spells it in a meta label.
func sdName(s string) string { return sdUnsafe.ReplaceAllString(s, "_") }

// renderScrapeConfig is kubernetes.yml with its job "sidecar" given
// targets instead of Kubernetes discovery, scraping and evaluating every
// second, its rule files made absolute. The job's other settings
// (relabeling, scheme, path, credentials) stay as they are.
func renderScrapeConfig(t *testing.T, targets []scrapeTarget) []byte {
	t.Helper()
	b, err := os.ReadFile(scrapeConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%s: %v", scrapeConfigFile, err)
	}
	cfg["global"] = map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"}
	rules, _ := cfg["rule_files"].([]any)
	for i, r := range rules {
		p, err := filepath.Abs(filepath.Join(filepath.Dir(scrapeConfigFile), r.(string)))
		if err != nil {
			t.Fatal(err)
		}
		rules[i] = p
	}
	jobs, _ := cfg["scrape_configs"].([]any)
	var job map[string]any
	for _, j := range jobs {
		if m, _ := j.(map[string]any); m["job_name"] == "sidecar" {
			job = m
		}
	}
	if job == nil || len(jobs) != 1 {
		t.Fatalf("%s: want one scrape job, named sidecar (the job alerts.yml selects)", scrapeConfigFile)
	}
	if _, ok := job["kubernetes_sd_configs"]; !ok {
		t.Fatalf("%s: job sidecar does not discover its targets in Kubernetes", scrapeConfigFile)
	}
	delete(job, "kubernetes_sd_configs")
	job["static_configs"] = targets
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// prometheusBinary is Prometheus from PATH or Debian's package
// (deploy/prometheus/install.sh), or the test skips.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if st, err := os.Stat("/usr/bin/prometheus"); err == nil && st.Mode()&0o111 != 0 {
		return "/usr/bin/prometheus"
	}
	t.Skip("prometheus is not installed: run deploy/prometheus/install.sh (Debian's prometheus package) to run this test")
	return ""
}

type promServer struct{ base string }

func startPrometheus(t *testing.T, bin string, cfg []byte) *promServer {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "--config.file="+path, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	startProcess(t, cmd, "prometheus")
	p := &promServer{base: "http://" + addr}
	waitUntil(t, "prometheus to be ready", 2*time.Minute, func() bool {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("scrape config:\n%s", cfg)
	return p
}

type promTarget struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

// waitScraped waits until the one active target of job sidecar has been
// scraped and returns it: healthy, or answered with an HTTP error (which
// no waiting changes). Any other error (the address not listening yet) is
// waited out.
func (p *promServer) waitScraped(t *testing.T) promTarget {
	t.Helper()
	var last promTarget
	waitUntil(t, "Prometheus to scrape the sidecar", 3*time.Minute, func() bool {
		var d struct {
			ActiveTargets []promTarget `json:"activeTargets"`
		}
		if err := p.get("/api/v1/targets?state=active", &d); err != nil {
			return false
		}
		var mine []promTarget
		for _, tg := range d.ActiveTargets {
			if tg.Labels["job"] == "sidecar" {
				mine = append(mine, tg)
			}
		}
		if len(mine) != 1 {
			if len(mine) > 1 {
				t.Fatalf("%d active targets for one pod, want 1: %+v", len(mine), mine)
			}
			return false
		}
		last = mine[0]
		return last.Health == "up" || (last.Health == "down" && strings.Contains(last.LastError, "HTTP status"))
	})
	return last
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

func (s promSample) value() float64 {
	if len(s.Value) != 2 {
		return -1
	}
	str, _ := s.Value[1].(string)
	f, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return -1
	}
	return f
}

func (p *promServer) query(expr string) ([]promSample, error) {
	var d struct {
		Result []promSample `json:"result"`
	}
	err := p.get("/api/v1/query?"+url.Values{"query": {expr}}.Encode(), &d)
	return d.Result, err
}

func (p *promServer) get(path string, out any) error {
	resp, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// startProcess starts cmd with its output in a file, and stops it (SIGTERM
// by pid, SIGKILL a minute later) when the test ends, showing the output's
// tail if the test failed.
func startProcess(t *testing.T, cmd *exec.Cmd, what string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "output.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) > 30 {
				lines = lines[len(lines)-30:]
			}
			t.Logf("%s (pid %d) output:\n%s", what, cmd.Process.Pid, strings.Join(lines, "\n"))
		}
	})
}

// waitUntil polls ok until it is true, failing the test after within (a
// safety net, not a budget).
func waitUntil(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", within, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
