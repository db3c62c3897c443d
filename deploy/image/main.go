// Command image builds the sidecar's container image without a container
// daemon (go-containerregistry): the static sidecar binary, for linux/amd64,
// on an empty base, run as the non-root user 65532 with the binary as the
// entrypoint. It writes a tarball that `docker load`, `podman load` or
// `crane push` take.
//
//	go run ./deploy/image -o sidecar.tar [-tag REF] [-binary PATH]
//
// Run from deploy/image (a module of its own, so the sidecar's own module
// does not depend on go-containerregistry). Without -binary it builds
// ../../cmd/sidecar with CGO_ENABLED=0.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	out := flag.String("o", "sidecar-image.tar", "the image tarball to write")
	tag := flag.String("tag", DefaultRepository+":dev", "the image reference recorded in the tarball")
	binary := flag.String("binary", "", "a linux/amd64 sidecar binary to put in the image (default: build ../../cmd/sidecar)")
	flag.Parse()
	if err := run(*out, *tag, *binary); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(out, tag, binary string) error {
	if binary == "" {
		dir, err := os.MkdirTemp("", "sidecar-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if binary, err = BuildBinary("../..", dir); err != nil {
			return err
		}
	}
	img, err := Build(binary)
	if err != nil {
		return err
	}
	return Write(out, tag, img)
}
