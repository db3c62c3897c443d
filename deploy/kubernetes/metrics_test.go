package kubernetes

import (
	"net"
	"os"
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// sets is the one-pod set and the replicated set, each a complete render
// of the chart.
func sets(t *testing.T) map[string]*manifests {
	t.Helper()
	return map[string]*manifests{"OnePod": loadManifests(t), "Replicated": loadManifestsIn(t, "replicated")}
}

// TestManifests_MetricsListener: Prometheus scrapes the metrics listener,
// which needs no token, not the API, which does. SIDECAR_METRICS_LISTEN is
// the container port "metrics" on all interfaces, the Service has a port
// for it, and its prometheus.io/* annotations point at it.
func TestManifests_MetricsListener(t *testing.T) {
	for name, m := range sets(t) {
		t.Run(name, func(t *testing.T) {
			d := the(t, "Deployments", m.deployments)
			cm := the(t, "ConfigMaps", m.configMaps)
			svc := the(t, "Services", m.services)
			c := container(t, d, "sidecar")
			metrics := portNumber(t, c, intstr.FromString("metrics"))
			if metrics == portNumber(t, c, intstr.FromString("http")) {
				t.Fatalf("container ports http and metrics are both %d", metrics)
			}
			host, port, err := net.SplitHostPort(cm.Data["SIDECAR_METRICS_LISTEN"])
			if err != nil {
				t.Fatalf("SIDECAR_METRICS_LISTEN %q: %v (without it Prometheus has no listener it may scrape without a token)", cm.Data["SIDECAR_METRICS_LISTEN"], err)
			}
			if host != "0.0.0.0" && host != "" {
				t.Errorf("SIDECAR_METRICS_LISTEN host %q: Prometheus cannot reach it, want 0.0.0.0", host)
			}
			if port != strconv.Itoa(int(metrics)) {
				t.Errorf("SIDECAR_METRICS_LISTEN port %s, container port metrics %d", port, metrics)
			}
			i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" })
			if i < 0 {
				t.Fatal("the Service has no port named metrics")
			}
			if got := portNumber(t, c, svc.Spec.Ports[i].TargetPort); got != metrics {
				t.Errorf("Service port metrics targets %d, want the container's metrics port %d", got, metrics)
			}
			a := svc.Annotations
			if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(metrics)) || a["prometheus.io/path"] != "/metrics" {
				t.Errorf("prometheus.io annotations %v: want scrape true, port %d (the metrics listener), path /metrics", a, metrics)
			}
			if s, ok := a["prometheus.io/scheme"]; ok && s != "http" {
				t.Errorf("prometheus.io/scheme %q: the metrics listener serves plain HTTP", s)
			}
		})
	}
}

// TestNetworkPolicy: the policy selects the sidecar's pods, lets anyone
// reach the API port (which authenticates), and only Prometheus the
// metrics port (which does not); nothing else is open.
func TestNetworkPolicy(t *testing.T) {
	for name, m := range sets(t) {
		t.Run(name, func(t *testing.T) {
			d := the(t, "Deployments", m.deployments)
			np := the(t, "NetworkPolicies", m.policies)
			c := container(t, d, "sidecar")
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Fatalf("the NetworkPolicy's podSelector %v does not select the sidecar's pods %v (%v)", np.Spec.PodSelector, d.Spec.Template.Labels, err)
			}
			if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
				t.Error("policyTypes lacks Ingress")
			}
			httpPort := portNumber(t, c, intstr.FromString("http"))
			metricsPort := portNumber(t, c, intstr.FromString("metrics"))
			// The task proxy's port, when the pod serves one, is open to the
			// workers that poll through it, like the API's.
			proxyPort := int32(-1)
			if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "conductor-proxy" }) {
				proxyPort = portNumber(t, c, intstr.FromString("conductor-proxy"))
			}
			httpOpen, metricsFromPeers, proxyOpen := false, false, false
			for i, r := range np.Spec.Ingress {
				if len(r.Ports) == 0 {
					t.Errorf("ingress rule %d has no ports: it opens every port of the pod", i)
				}
				for _, p := range r.Ports {
					if p.Port == nil || p.EndPort != nil {
						t.Errorf("ingress rule %d: a port range or every port: want the named ports", i)
						continue
					}
					switch portNumber(t, c, *p.Port) {
					case httpPort:
						httpOpen = httpOpen || len(r.From) == 0
					case proxyPort:
						proxyOpen = true
					case metricsPort:
						if len(r.From) == 0 {
							t.Errorf("ingress rule %d opens the metrics port (no token) to every pod", i)
						}
						for _, peer := range r.From {
							if peer.IPBlock != nil || peer.NamespaceSelector == nil || peer.PodSelector == nil ||
								len(peer.NamespaceSelector.MatchLabels)+len(peer.NamespaceSelector.MatchExpressions) == 0 ||
								len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0 {
								t.Errorf("ingress rule %d: peer %+v: want Prometheus's pods by namespace and pod labels", i, peer)
							}
						}
						metricsFromPeers = true
					default:
						t.Errorf("ingress rule %d opens port %v, neither http nor metrics", i, p.Port)
					}
				}
			}
			if !httpOpen {
				t.Error("the API port (http) is not open to its clients")
			}
			if !metricsFromPeers {
				t.Error("the metrics port is not open to Prometheus")
			}
			if proxyPort >= 0 && !proxyOpen {
				t.Error("the pod serves the task proxy, but its port (conductor-proxy) is not open to the workers")
			}
		})
	}
}

// TestManifests_SecretVolumeModes: a credential file is readable by its
// owner and, through fsGroup, the sidecar's group only: no Secret volume
// gives write, execute or world bits, and group read only with an fsGroup
// (the kubelet adds group read to a Secret volume when the pod has one,
// whatever defaultMode says: kubeletSecretMode).
func TestManifests_SecretVolumeModes(t *testing.T) {
	for name, m := range sets(t) {
		t.Run(name, func(t *testing.T) {
			d := the(t, "Deployments", m.deployments)
			checkSecretModes(t, d)
		})
	}
}

func checkSecretModes(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := &d.Spec.Template.Spec
	n := 0
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		n++
		if v.Secret.DefaultMode == nil {
			t.Errorf("Secret volume %s: no defaultMode (0644: world-readable)", v.Name)
			continue
		}
		modes := []int32{*v.Secret.DefaultMode}
		for _, it := range v.Secret.Items {
			if it.Mode != nil {
				modes = append(modes, *it.Mode)
			}
		}
		for _, m := range modes {
			switch {
			case m&^0o440 != 0:
				t.Errorf("Secret volume %s: mode %#o, want 0400 or 0440: no write, execute or world bits", v.Name, m)
			case m&0o040 != 0 && (pod.SecurityContext == nil || pod.SecurityContext.FSGroup == nil):
				t.Errorf("Secret volume %s: mode %#o is group-readable without an fsGroup (the group is root's)", v.Name, m)
			}
		}
		if got := kubeletSecretMode(v.Secret, pod.SecurityContext); got&^os.FileMode(0o440) != 0 {
			t.Errorf("Secret volume %s: the kubelet writes its files %#o", v.Name, got)
		}
	}
	if n == 0 {
		t.Fatal("no Secret volume: the tokens file is not mounted")
	}
}
