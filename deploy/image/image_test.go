package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImage builds the image as CI does (no daemon), reads the tarball
// back, checks its configuration (non-root, the binary as entrypoint,
// linux/amd64) and runs the binary taken out of its layer.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sidecar.tar")
	if err := run(path, DefaultRepository+":test", ""); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || strings.HasPrefix(c.User, "0") || c.User == "" {
		t.Errorf("user %q: want 65532:65532 (non-root, as deploy/kubernetes's runAsUser)", c.User)
	}
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/"+BinaryPath || len(c.Cmd) != 1 || c.Cmd[0] != "serve" {
		t.Errorf("entrypoint %v cmd %v: want [/%s] [serve]", c.Entrypoint, c.Cmd, BinaryPath)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if _, ok := c.ExposedPorts["8787/tcp"]; !ok {
		t.Errorf("exposed ports %v: want 8787/tcp", c.ExposedPorts)
	}

	// The layer: the binary executable, the data dir the user's.
	bin := filepath.Join(dir, "sidecar")
	tr := tar.NewReader(mutate.Extract(img))
	seen := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[strings.TrimSuffix(h.Name, "/")] = h
		if h.Name == BinaryPath {
			f, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	if h := seen[BinaryPath]; h == nil || h.Mode&0o111 == 0 {
		t.Fatalf("no executable %s in the layer", BinaryPath)
	}
	if h := seen[DataDir]; h == nil || h.Uid != UID {
		t.Errorf("%s: want a directory owned by %d, got %+v", DataDir, UID, h)
	}
	if seen["etc/passwd"] == nil {
		t.Error("no etc/passwd: the user has no name")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("the image's binary is linux/amd64; this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "sidecar ") {
		t.Fatalf("the image's binary: %v\n%s", err, out)
	}
}
