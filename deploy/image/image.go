package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultRepository is the image's name; deploy/kubernetes names it.
const DefaultRepository = "ghcr.io/conductor-sidecar/sidecar"

// The image's user, as in deploy/kubernetes's runAsUser: distroless's
// "nonroot".
const (
	UID        = 65532
	BinaryPath = "usr/local/bin/sidecar"
	// DataDir is the working directory, owned by UID: serve's default
	// --data-dir ./data lands in it, and the manifests mount the data
	// volume there.
	DataDir = "var/lib/sidecar"
	// CABundle is where the host's CA certificates go, for https to
	// Conductor and tls:// to NATS (the base is empty).
	CABundle = "etc/ssl/certs/ca-certificates.crt"
)

// hostCABundle is the build machine's CA bundle (Debian's ca-certificates).
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

// BuildBinary builds the static linux/amd64 sidecar of the module at
// root into dir and returns its path.
func BuildBinary(root, dir string) (string, error) {
	out := filepath.Join(dir, "sidecar")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/sidecar")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/sidecar: %v\n%s", err, b)
	}
	return out, nil
}

// Build returns the image holding binary.
func Build(binary string) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	files := []file{
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/%s:/sbin/nologin\n", UID, UID, DataDir))},
		{name: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID))},
		{name: "tmp/", dir: true, mode: 0o1777},
		{name: "usr/", dir: true, mode: 0o755},
		{name: "usr/local/", dir: true, mode: 0o755},
		{name: "usr/local/bin/", dir: true, mode: 0o755},
		{name: BinaryPath, mode: 0o755, data: bin},
		{name: "var/", dir: true, mode: 0o755},
		{name: "var/lib/", dir: true, mode: 0o755},
		{name: DataDir + "/", dir: true, mode: 0o750, uid: UID},
	}
	if ca, err := os.ReadFile(hostCABundle); err == nil {
		files = append(files, file{name: "etc/ssl/", dir: true, mode: 0o755}, file{name: "etc/ssl/certs/", dir: true, mode: 0o755},
			file{name: CABundle, mode: 0o644, data: ca})
	} else {
		fmt.Fprintf(os.Stderr, "image: no %s on this machine: the image trusts no CA (install ca-certificates)\n", hostCABundle)
	}
	layerTar, err := tarOf(files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", UID, UID),
		Entrypoint:   []string{"/" + BinaryPath},
		Cmd:          []string{"serve"},
		WorkingDir:   "/" + DataDir,
		Env:          []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=/" + CABundle},
		ExposedPorts: map[string]struct{}{"8787/tcp": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":  "conductor-sidecar",
			"org.opencontainers.image.source": "https://github.com/conductor-sidecar/sidecar",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// Write writes img to path as a tarball recording ref.
func Write(path, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", ref, err)
	}
	return tarball.WriteToFile(path, tag, img)
}

type file struct {
	name string
	dir  bool
	mode int64
	uid  int
	data []byte
}

// tarOf is a layer's tar, with fixed times so that the same binary gives
// the same layer digest.
func tarOf(files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
