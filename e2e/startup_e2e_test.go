package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// startedServe is a "sidecar serve" started without waiting for it: the
// test watches whether it becomes ready or exits.
type startedServe struct {
	*proc
	exited chan struct{} // closed once the process ended
	err    error         // its exit status, set before exited closes
}

// launchServe starts serve (flags as startServe) once release is closed and
// returns at once; the cleanup stops it with SIGTERM.
func launchServe(t *testing.T, dataDir, addr string, release <-chan struct{}, extra ...string) *startedServe {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), "sidecar.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--conductor-url", conductortest.URL(t), "--data-dir", dataDir, "--listen", addr,
		"--worker-id", "e2e-" + filepath.Base(dataDir), "--log-format", "console", "--shutdown-grace", "5s"}, extra...)
	cmd := exec.Command(sidecartest.Binary(t), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	s := &startedServe{proc: &proc{cmd: cmd, addr: addr, client: httpapi.NewClient("http://" + addr), log: logf}, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		<-release
		if err := proctest.StartTied(cmd); err != nil {
			started <- err
			s.err = err
			close(s.exited)
			return
		}
		started <- nil
		s.err = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		if err := <-started; err != nil {
			t.Errorf("start serve: %v", err)
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("sidecar log (%s):\n%s", addr, sidecartest.Tail(string(b), sidecartest.LogLines()))
		}
	})
	return s
}

// waitReady waits until /readyz answers 200; it returns an error with
// the end of the log at once if the process exits first.
func (s *startedServe) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case <-s.exited:
			b, _ := os.ReadFile(s.log.Name())
			return fmt.Errorf("serve %s exited before it was ready (%v):\n%s", s.addr, s.err, sidecartest.Tail(string(b), 20))
		default:
		}
		if resp, err := http.Get("http://" + s.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.log.Name())
			return fmt.Errorf("serve %s not ready after %s:\n%s", s.addr, within, sidecartest.Tail(string(b), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startNATSClusterEarly starts a cluster as startNATSCluster does, but
// returns as soon as every node takes client connections, without waiting
// for /healthz: the nodes may not have elected a JetStream meta leader yet.
func startNATSClusterEarly(t *testing.T) *natsCluster {
	t.Helper()
	if os.Getenv("SIDECAR_TEST_NATS_CLUSTER") != "1" {
		t.Skip("SIDECAR_TEST_NATS_CLUSTER=1 runs a 3-node NATS cluster (deploy/local/nats-cluster.sh)")
	}
	base := freeClusterPorts(t)
	c := &natsCluster{env: append(os.Environ(), "NATS_CLUSTER_DIR="+t.TempDir(), "NATS_CLUSTER_PORT="+strconv.Itoa(base))}
	t.Cleanup(func() { c.run(t, "stop") })
	cmd := exec.Command(filepath.Join("..", "deploy", "local", "nats-cluster.sh"), "start")
	cmd.Env = c.env
	addrs := make([]string, 3)
	for node := range addrs {
		addrs[node] = "127.0.0.1:" + strconv.Itoa(base+node)
	}
	// The script ends by itself once the cluster is healthy (the nodes run
	// on): its end is waited for, not forced, before the stop.
	proctest.Start(t, cmd, proctest.Options{Stop: func(*proctest.Process) {}}, addrs...)
	return c
}

// TestE2E_ReplicasStartTogether: three serves started at the same moment
// on a fresh 3-node NATS cluster (--nats-replicas 3), as the pods of a
// Deployment start, all become ready: while the replicas race to create
// the same streams, and a stream created an instant ago has no replica
// that answers yet, serve starts again instead of exiting. Then each
// replica runs a run to COMPLETED. Three rounds on a fresh cluster that is
// healthy, and one where the serves start as soon as the nodes take
// connections (no JetStream meta leader yet).
func TestE2E_ReplicasStartTogether(t *testing.T) {
	t.Parallel() // its own serve and data dir
	for _, round := range []struct {
		name  string
		start func(*testing.T) *natsCluster
	}{
		{"round1", startNATSCluster}, {"round2", startNATSCluster}, {"round3", startNATSCluster},
		{"beforeTheClusterIsHealthy", startNATSClusterEarly},
	} {
		t.Run(round.name, func(t *testing.T) {
			cl := round.start(t)
			url := cl.url(t)
			domain := "--task-domain=" + uniq("e2e-together")
			release := make(chan struct{})
			reps := make([]*startedServe, 3)
			for i := range reps {
				reps[i] = launchServe(t, t.TempDir(), sidecartest.FreeAddr(t), release, "--nats-url", url, "--nats-replicas", "3", domain)
			}
			close(release)
			var wg sync.WaitGroup
			for _, r := range reps {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := r.waitReady(5 * time.Minute); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			for i, r := range reps {
				b, err := os.ReadFile(r.log.Name())
				if err != nil {
					t.Fatal(err)
				}
				var retries []string
				for _, line := range strings.Split(string(b), "\n") {
					if strings.Contains(line, "the NATS cluster is not ready") || strings.Contains(line, "started once the NATS cluster was ready") {
						retries = append(retries, line)
					}
				}
				t.Logf("replica %d:%s", i, strings.Join(append([]string{""}, retries...), "\n  "))
			}
			pl := mustPlan(t, `{"planId":"`+uniq("e2e-together")+`","planVersion":"1","steps":[
				{"stepId":"a","executor":{"type":"noop"}},
				{"stepId":"b","executor":{"type":"noop"},"dependsOn":["a"]}]}`)
			for i, r := range reps {
				runID := submit(t, r.proc, pl, uniq(fmt.Sprintf("req-%d", i))).RunID
				if v := waitTerminal(t, r.proc, runID, 3*time.Minute); v.Status != "COMPLETED" {
					t.Fatalf("replica %d: run %s ended %s, want COMPLETED", i, runID, v.Status)
				}
			}
		})
	}
}

// TestServe_NATSURLRefusalsFailAtOnce: with --nats-url and a long
// --nats-start-timeout, what waiting does not fix still ends serve at
// once, in one line: a damaged event stream, a server without JetStream,
// and a NATS user that may not create the sidecar's streams (the server
// drops such a request, so it only times out; the connection's last error
// names the violation), and an address where no NATS server listens (the
// refusal names --nats-url).
func TestServe_NATSURLRefusalsFailAtOnce(t *testing.T) {
	t.Run("Damaged", func(t *testing.T) {
		admin, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "e2e-admin-pw", Permissions: natsstore.AllPermissions})
		if _, err := admin.CreateStream(context.Background(), jetstream.StreamConfig{Name: natsstore.DefaultStream,
			Subjects: []string{natsstore.DefaultSubjectPrefix + ".>"}, Storage: jetstream.FileStorage}); err != nil {
			t.Fatal(err)
		}
		out := serveMustRefuse(t, 2*time.Minute, "--nats-url", srv.URL(), "--nats-start-timeout", "30m", "--listen", sidecartest.FreeAddr(t))
		t.Logf("refusal: %s", lastLine(out))
		if line := lastLine(out); !strings.Contains(line, "STORE_DAMAGED") || strings.Contains(out, "starting again") {
			t.Fatalf("want one STORE_DAMAGED refusal without a retry:\n%s", sidecartest.Tail(out, 20))
		}
	})
	t.Run("NoJetStream", func(t *testing.T) {
		// A server without JetStream answers "jetstream not enabled"
		// (10076): a misconfiguration, not a cluster that is starting.
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		srv.Start()
		t.Cleanup(srv.Shutdown)
		if !srv.ReadyForConnections(time.Minute) {
			t.Fatal("nats server not ready")
		}
		out := serveMustRefuse(t, 2*time.Minute, "--nats-url", srv.ClientURL(), "--nats-start-timeout", "30m", "--listen", sidecartest.FreeAddr(t))
		t.Logf("refusal: %s", lastLine(out))
		if line := lastLine(out); !strings.Contains(line, "jetstream not enabled") || strings.Contains(out, "starting again") {
			t.Fatalf("want one refusal that says JetStream is not enabled, without a retry:\n%s", sidecartest.Tail(out, 20))
		}
	})
	t.Run("PermissionDenied", func(t *testing.T) {
		perms := natsstore.Permissions(natsstore.DefaultSubjectPrefix)
		perms.Publish.Deny = append(perms.Publish.Deny, "$JS.API.STREAM.CREATE.>")
		_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "e2e-pw", Permissions: perms})
		out := serveMustRefuse(t, 2*time.Minute, "--nats-url", srv.URL(), "--nats-start-timeout", "30m", "--listen", sidecartest.FreeAddr(t))
		t.Logf("refusal: %s", lastLine(out))
		if line := lastLine(out); !strings.Contains(line, "permissions violation") || strings.Contains(out, "starting again") {
			t.Fatalf("want one refusal naming the permissions violation, without a retry:\n%s", sidecartest.Tail(out, 20))
		}
	})
	t.Run("NothingListens", func(t *testing.T) {
		out := serveMustRefuse(t, 2*time.Minute, "--nats-url", "nats://"+sidecartest.FreeAddr(t), "--nats-insecure-no-auth", "--nats-start-timeout", "30m", "--listen", sidecartest.FreeAddr(t))
		t.Logf("refusal: %s", lastLine(out))
		if line := lastLine(out); !strings.Contains(line, "no servers available") || !strings.Contains(line, "check --nats-url") {
			t.Fatalf("want one refusal that names the flag to check:\n%s", sidecartest.Tail(out, 20))
		}
	})
}

// TestE2E_NATSStartTimeoutBounds: on a cluster that has lost its
// JetStream quorum (two of three nodes killed) serve keeps starting again
// with one line per retry, then gives up after --nats-start-timeout with
// one line that names the flag and the last error. SIGTERM while it
// waits ends it at once.
func TestE2E_NATSStartTimeoutBounds(t *testing.T) {
	cl := startNATSCluster(t)
	url := cl.url(t)
	cl.run(t, "kill", "2")
	cl.run(t, "kill", "3")
	out := serveMustRefuse(t, 3*time.Minute, "--nats-url", url, "--nats-start-timeout", "10s", "--listen", sidecartest.FreeAddr(t))
	line := lastLine(out)
	t.Logf("refusal: %s", line)
	if !strings.Contains(line, "not ready within --nats-start-timeout 10s") {
		t.Fatalf("want a refusal naming --nats-start-timeout:\n%s", sidecartest.Tail(out, 30))
	}
	lines := strings.Split(out, "\n")
	retries := 0
	for i, l := range lines {
		if !strings.Contains(l, "the NATS cluster is not ready; starting again") {
			continue
		}
		retries++
		// One line: the next one is another record, not a stack frame.
		if i+1 < len(lines) && lines[i+1] != "" && !strings.HasPrefix(lines[i+1], "20") && !strings.HasPrefix(lines[i+1], "sidecar serve:") {
			t.Fatalf("a retry logged more than one line:\n%s", strings.Join(lines[i:min(i+8, len(lines))], "\n"))
		}
	}
	if retries == 0 {
		t.Fatalf("no retry logged:\n%s", sidecartest.Tail(out, 30))
	}
	t.Logf("%d retries logged", retries)

	// SIGTERM while serve waits ends it at once, saying what it waited for.
	logf, err := os.Create(filepath.Join(t.TempDir(), "sidecar.log"))
	if err != nil {
		t.Fatal(err)
	}
	apiAddr, proxyAddr := sidecartest.FreeAddr(t), sidecartest.FreeAddr(t)
	cmd := exec.Command(sidecartest.Binary(t), "serve", "--conductor-url", conductortest.URL(t), "--log-format", "console",
		"--nats-url", url, "--nats-start-timeout", "30m", "--listen", apiAddr, "--conductor-proxy-listen", proxyAddr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := proctest.StartTied(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	sidecartest.WaitFor(t, "serve to retry", 3*time.Minute, func() bool {
		b, _ := os.ReadFile(logf.Name())
		return strings.Contains(string(b), "starting again")
	})
	// Meanwhile its ports answer at once that it is starting, rather
	// than keep requests waiting to be served minutes later.
	impatient := &http.Client{Timeout: 3 * time.Second}
	for _, u := range []string{"http://" + apiAddr + "/healthz", "http://" + apiAddr + "/readyz", "http://" + proxyAddr + "/api/tasks/poll/batch/x"} {
		res, err := impatient.Get(u)
		if err != nil {
			t.Fatalf("GET %s while serve waits for the cluster: %v, want 503 NOT_READY at once", u, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"NOT_READY"`) {
			t.Fatalf("GET %s while serve waits for the cluster: %d %s, want 503 NOT_READY", u, res.StatusCode, b)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
	case <-time.After(2 * time.Minute):
		t.Fatal("serve still waits for the cluster 2 minutes after SIGTERM")
	}
	b, _ := os.ReadFile(logf.Name())
	t.Logf("after SIGTERM: %s", lastLine(string(b)))
	if line := lastLine(string(b)); !strings.Contains(line, "stopped while waiting for the NATS cluster to be ready") {
		t.Fatalf("after SIGTERM while waiting: %q, want it to say it stopped while waiting", line)
	}
}

// TestServe_SIGTERMDuringTheFirstStartAttempt: a signal while serve's
// first attempt waits on a cluster that does not answer (one node of a
// new 3-node cluster: no JetStream leader, its API requests unanswered)
// ends serve at once, saying it stopped while starting.
func TestServe_SIGTERMDuringTheFirstStartAttempt(t *testing.T) {
	t.Parallel() // its own server and serve
	peers := []string{sidecartest.FreeAddr(t), sidecartest.FreeAddr(t)}
	routes := make([]*url.URL, len(peers))
	for i, p := range peers {
		routes[i] = &url.URL{Scheme: "nats", Host: p}
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, ServerName: "n1",
		JetStream: true, StoreDir: t.TempDir(), Cluster: server.ClusterOpts{Name: "lonely", Host: "127.0.0.1", Port: -1}, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "sidecar.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sidecartest.Binary(t), "serve", "--conductor-url", conductortest.URL(t), "--log-format", "console",
		"--nats-url", srv.ClientURL(), "--nats-insecure-no-auth", "--listen", sidecartest.FreeAddr(t))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := proctest.StartTied(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(time.Second) // inside the first attempt's first request (5 s)
	signalled := time.Now()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		t.Logf("ended %s after SIGTERM", time.Since(signalled).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("serve still runs 30 s after SIGTERM")
	}
	b, _ := os.ReadFile(logf.Name())
	line := lastLine(string(b))
	t.Logf("after SIGTERM: %s", line)
	if strings.Contains(string(b), "starting again") {
		t.Skip("the first attempt ended before the signal; nothing to check")
	}
	if !strings.Contains(line, "stopped while starting") {
		t.Fatalf("after SIGTERM during the first attempt: %q, want it to say it stopped while starting", line)
	}
}
