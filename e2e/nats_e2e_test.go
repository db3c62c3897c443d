package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// Who may touch the log, and one owner per data dir.
// Each test drives the real binary; SIDECAR_TEST_BINARY runs them against
// an older build (they fail on the build before the fix).

// listeningPorts returns the TCP ports pid listens on, read from /proc.
func listeningPorts(t *testing.T, pid int) []int {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("read fds of %d: %v", pid, err)
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			// sl local_address rem_address st ... inode (field 9)
			if len(fl) < 10 || fl[3] != "0A" || !inodes[fl[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(fl[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
				ports = append(ports, int(p))
			}
		}
		f.Close()
	}
	return ports
}

// TestServe_EmbeddedNATSListensNowhere: serve with the embedded server
// listens on one TCP port, the API's. Before the fix the embedded server
// also listened on a random loopback port without credentials, where any
// local process forged a RunCompleted and deleted the event stream.
func TestServe_EmbeddedNATSListensNowhere(t *testing.T) {
	addr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), addr)
	ports := listeningPorts(t, p.cmd.Process.Pid)
	_, apiPort, _ := strings.Cut(addr, ":")
	if len(ports) != 1 || strconv.Itoa(ports[0]) != apiPort {
		t.Fatalf("serve listens on TCP ports %v, want only the API's %s", ports, apiPort)
	}
	if b, _ := os.ReadFile(p.log.Name()); strings.Contains(string(b), "Listening for client connections") {
		t.Fatalf("the embedded NATS server announced a client listener:\n%s", b)
	}
}

// exited runs serve with args and waits up to within for it to exit. It
// fails the test if serve is still running then (it became ready instead
// of refusing) or exited 0.
func serveMustRefuse(t *testing.T, within time.Duration, args ...string) string {
	t.Helper()
	args = append([]string{"serve", "--conductor-url", conductortest.URL(t), "--log-format", "console"}, args...)
	cmd := exec.Command(sidecartest.Binary(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := proctest.StartTied(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("serve exited 0, want a refusal:\n%s", out.String())
		}
		return out.String()
	case <-time.After(within):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("serve still running after %s, want it to refuse to start:\n%s", within, sidecartest.Tail(out.String(), 30))
	}
	return ""
}

// lastLine is the last non-empty line of out: serve's one-line reason.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// TestServe_DataDirLocked: a second serve on a data dir in use exits at
// once naming the holder. Before the fix both ran and corrupted each
// other's store (runs accepted with 201 were then 404 on both).
func TestServe_DataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first := startServe(t, dir, sidecartest.FreeAddr(t))
	began := time.Now()
	out := serveMustRefuse(t, 10*time.Second, "--data-dir", dir, "--listen", sidecartest.FreeAddr(t))
	line := lastLine(out)
	if !strings.Contains(line, "DATA_DIR_LOCKED") || !strings.Contains(line, "held by") || !strings.Contains(line, fmt.Sprintf("pid=%d", first.cmd.Process.Pid)) {
		t.Fatalf("refusal does not name the holder (pid %d): %q", first.cmd.Process.Pid, line)
	}
	t.Logf("refused in %s: %s", time.Since(began).Round(time.Millisecond), line)
	// The first one is unharmed.
	if resp, err := http.Get("http://" + first.addr + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first serve not ready after the refused second: %v %v", resp, err)
	}
}

// TestServe_AddressInUse: a serve whose --listen address another process
// holds refuses at once, in one line with a code and the fix.
func TestServe_AddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	line := lastLine(serveMustRefuse(t, 10*time.Second, "--data-dir", t.TempDir(), "--listen", ln.Addr().String()))
	if !strings.Contains(line, "ADDRESS_IN_USE") || !strings.Contains(line, "--listen "+ln.Addr().String()) || !strings.Contains(line, "another address") {
		t.Fatalf("refusal %q: want ADDRESS_IN_USE naming --listen %s and the fix", line, ln.Addr())
	}
}

// TestServe_RefusesDamagedLog: the log's block file is truncated while no
// sidecar runs; serve refuses to start, naming the damage and the runbook.
// Before the fix it started, reported ready, and served runs that had lost
// events.
func TestServe_RefusesDamagedLog(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command(sidecartest.Binary(t), "demo", "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	blks, _ := filepath.Glob(filepath.Join(dir, "jetstream", "*", "streams", natsstore.DefaultStream, "msgs", "*.blk"))
	if len(blks) == 0 {
		t.Fatalf("no block file of %s in %s", natsstore.DefaultStream, dir)
	}
	fi, err := os.Stat(blks[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(blks[0], fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	line := lastLine(serveMustRefuse(t, 20*time.Second, "--data-dir", dir, "--listen", sidecartest.FreeAddr(t)))
	if !strings.Contains(line, "STORE_DAMAGED") || !strings.Contains(line, "Damaged data dir") {
		t.Fatalf("refusal does not name the damage and the runbook: %q", line)
	}
}

// TestServe_ReadyzReportsDeletedStream: on an external NATS where an
// administrator deletes the event stream, /readyz turns 503 and says so.
// Before the fix /readyz stayed 200 while every start and read failed.
func TestServe_ReadyzReportsDeletedStream(t *testing.T) {
	admin, nats := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "e2e-admin-pw", Permissions: natsstore.AllPermissions})
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", nats.URL())
	ctx := context.Background()
	if err := admin.DeleteStream(ctx, natsstore.DefaultStream); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, p); code != http.StatusServiceUnavailable || !strings.Contains(body, "deleted") {
		t.Fatalf("/readyz after the stream was deleted: %d %s, want 503 naming the deletion", code, body)
	}
}

// TestServe_ReadyzReportsDeletedBucket: the same for a KV bucket (the run
// index) deleted by an administrator.
func TestServe_ReadyzReportsDeletedBucket(t *testing.T) {
	admin, nats := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "e2e-admin-pw", Permissions: natsstore.AllPermissions})
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", nats.URL())
	if err := admin.DeleteKeyValue(context.Background(), "SIDECAR_RUNS"); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, p); code != http.StatusServiceUnavailable || !strings.Contains(body, "KV_SIDECAR_RUNS was deleted") {
		t.Fatalf("/readyz after the run index bucket was deleted: %d %s, want 503 naming it", code, body)
	}
}

// startConfServer runs a real nats-server from deploy/nats/sidecar.conf
// (included from a server config with JetStream and a random loopback
// port) and returns its client URL.
func startConfServer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	conf, err := os.ReadFile("../deploy/nats/sidecar.conf")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sidecar.conf"), conf, 0o600); err != nil {
		t.Fatal(err)
	}
	main := fmt.Sprintf("listen: 127.0.0.1:-1\nserver_name: conf-test\njetstream { store_dir: %q }\ninclude ./sidecar.conf\n", filepath.Join(dir, "js"))
	path := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(path, []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SIDECAR_NATS_PASSWORD", "pw-sidecar")
	t.Setenv("SIDECAR_NATS_READER_PASSWORD", "pw-reader")
	t.Setenv("SIDECAR_NATS_ADMIN_PASSWORD", "pw-admin")
	t.Setenv("SIDECAR_NATS_RETENTION_PASSWORD", "pw-retention")
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoSigs = true
	// The file's rules are the ones the embedded server gives its user.
	for _, u := range opts.Users {
		var want *server.Permissions
		switch u.Username {
		case natsstore.SidecarUser:
			want = natsstore.Permissions(natsstore.DefaultSubjectPrefix)
		case natsstore.RetentionUser:
			want = natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, natsstore.DefaultSnapshotBucket, registry.DefaultBucket,
				natsstore.DefaultAlertBucket, adapter.DefaultRunsBucket, drain.DefaultBucket, admission.Bucket)
			want.Publish.Deny = nil
		default:
			continue
		}
		for _, c := range []struct {
			what      string
			got, want []string
		}{
			{"publish allow", u.Permissions.Publish.Allow, want.Publish.Allow},
			{"publish deny", u.Permissions.Publish.Deny, want.Publish.Deny},
			{"subscribe allow", u.Permissions.Subscribe.Allow, want.Subscribe.Allow},
		} {
			if !slices.Equal(slices.Sorted(slices.Values(c.got)), slices.Sorted(slices.Values(c.want))) {
				t.Errorf("deploy/nats/sidecar.conf %s of user %s: %v, natsstore: %v", c.what, u.Username, c.got, c.want)
			}
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server from sidecar.conf not ready")
	}
	return srv.ClientURL()
}

func connectAs(t *testing.T, url, user, pw string) (*nats.Conn, jetstream.JetStream, chan error) {
	t.Helper()
	errs := make(chan error, 16)
	nc, err := nats.Connect(url, nats.UserInfo(user, pw), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, errs
}

// TestSidecarConf_LeastPrivilege runs serve against a real nats-server
// configured with deploy/nats/sidecar.conf: a run goes through end to end
// with the sidecar's user, and that user cannot delete, purge or
// reconfigure the log, delete a record or forge an appended notification;
// the reader user cannot append an event.
func TestSidecarConf_LeastPrivilege(t *testing.T) {
	url := startConfServer(t)
	pwFile := filepath.Join(t.TempDir(), "nats-password")
	if err := os.WriteFile(pwFile, []byte("pw-sidecar\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", url, "--nats-user", "sidecar", "--nats-password-file", pwFile)
	pl := mustPlan(t, `{"planId":"e2e-conf","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`)
	run := submit(t, p, pl, uniq("conf"))
	if v := waitTerminal(t, p, run.RunID, time.Minute); v.Status != "COMPLETED" {
		t.Fatalf("run under least privilege: %s", v.Status)
	}

	ctx := context.Background()
	nc, js, errs := connectAs(t, url, "sidecar", "pw-sidecar")
	natstest.RequireNoRewrite(t, js, "SIDECAR_RUNS")
	if err := nc.Publish(natsstore.DefaultSubjectPrefix+"-appended.forged.key", nil); err != nil {
		t.Fatal(err)
	}
	expectViolation(t, nc, errs, "appended notification as user sidecar")

	rnc, rjs, rerrs := connectAs(t, url, "sidecar-reader", "pw-reader")
	if _, err := rjs.Stream(ctx, natsstore.DefaultStream); err != nil {
		t.Fatalf("reader cannot read the stream's info: %v", err)
	}
	if _, err := rjs.Publish(ctx, natsstore.EventSubject(natsstore.DefaultSubjectPrefix, run.RunID, strings.Repeat("f", 64)), []byte(`{}`)); err == nil {
		t.Error("reader appended an event")
	}
	expectViolation(t, rnc, rerrs, "event as user sidecar-reader")
	if resp, err := http.Get("http://" + p.addr + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz after the refused operations: %v %v", resp, err)
	}
}

func expectViolation(t *testing.T, nc *nats.Conn, errs chan error, what string) {
	t.Helper()
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("%s: got %v, want a permissions violation", what, err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("%s: no permissions violation reported", what)
	}
}

// mountTmpfs mounts a tmpfs of size bytes (read-only when ro) on a new
// directory and unmounts it when the test ends. Mounting needs root (CI
// and the developers' machines run as root); elsewhere the test is
// skipped, saying why.
func mountTmpfs(t *testing.T, size int64, ro bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("size=%d", size)
	if ro {
		opts += ",ro"
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs to make a full or read-only disk (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// TestServe_UnusableDataDir: a read-only or full data dir is refused at
// start with the real cause in the one-line exit message (before the fix:
// "nats server not ready within 10s", the cause only in a JSON log line),
// and a disk that fills while serve runs turns /readyz 503 until space is
// freed.
func TestServe_UnusableDataDir(t *testing.T) {
	t.Run("ReadOnly", func(t *testing.T) {
		ro := mountTmpfs(t, 1<<20, true)
		line := lastLine(serveMustRefuse(t, 20*time.Second, "--data-dir", filepath.Join(ro, "data"), "--listen", sidecartest.FreeAddr(t)))
		if !strings.Contains(line, "read-only file system") {
			t.Fatalf("exit message does not name the cause: %q", line)
		}
	})
	t.Run("Full", func(t *testing.T) {
		full := mountTmpfs(t, 1<<20, false)
		line := lastLine(serveMustRefuse(t, 20*time.Second, "--data-dir", filepath.Join(full, "data"), "--listen", sidecartest.FreeAddr(t)))
		if !strings.Contains(line, "free") {
			t.Fatalf("exit message does not name the cause: %q", line)
		}
	})
	t.Run("FillsWhileServing", func(t *testing.T) {
		mnt := mountTmpfs(t, 48<<20, false)
		p := startServe(t, filepath.Join(mnt, "data"), sidecartest.FreeAddr(t))
		filler := filepath.Join(mnt, "filler")
		if out, err := exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=1M", "count=40").CombinedOutput(); err != nil {
			t.Fatalf("dd: %v %s", err, out)
		}
		code, body := readyz(t, p)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "free") {
			t.Fatalf("/readyz with the disk full: %d %s, want 503 naming the free space", code, body)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if code, body := readyz(t, p); code != http.StatusOK {
			t.Fatalf("/readyz after freeing space: %d %s", code, body)
		}
	})
}

func readyz(t *testing.T, p *proc) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestServe_FailedStartTerminatesWorkflow: a start whose RunStarted cannot
// be written (the event stream is gone) answers 503 STORE_DAMAGED and
// leaves no workflow running in Conductor. Before the fix the workflow
// stayed RUNNING with no run in the log.
func TestServe_FailedStartTerminatesWorkflow(t *testing.T) {
	admin, nats := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "e2e-admin-pw", Permissions: natsstore.AllPermissions})
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", nats.URL())
	ctx := context.Background()
	if err := admin.DeleteStream(ctx, natsstore.DefaultStream); err != nil {
		t.Fatal(err)
	}
	planID := uniq("e2e-abandon")
	pl := mustPlan(t, `{"planId":"`+planID+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"sleep","seconds":30}}]}`)
	_, startErr := p.client.Start(ctx, httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: uniq("abandon"), Plan: pl})
	name := plan.WorkflowName("t-e2e", planID, "1")
	resp, err := http.Get(conductortest.URL(t) + "/workflow/running/" + name + "?version=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("Conductor's running %s after the failed start (%v): %d %s, want none", name, startErr, resp.StatusCode, body)
	}
	if startErr == nil || !strings.Contains(startErr.Error(), "STORE_DAMAGED") {
		t.Fatalf("start with the event stream gone: %v, want 503 STORE_DAMAGED", startErr)
	}
}
