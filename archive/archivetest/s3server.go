// Package archivetest runs a real S3-compatible server for tests: the
// versitygw gateway (posix backend) that deploy/local/s3server.sh builds,
// on a free loopback port and a directory of the test's own.
package archivetest

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/conductor-sidecar/sidecar/archive"
)

// EnvBinary names the S3 server binary the tests run.
const EnvBinary = "SIDECAR_TEST_S3SERVER"

// Credentials of the server's root user.
const (
	AccessKeyID     = "sidecar-test"
	SecretAccessKey = "sidecar-test-secret"
	Region          = "us-east-1"
)

// S3Server is a running S3-compatible server. Stop and Start take it down
// and up again on the same port and directory (a destination that is down).
type S3Server struct {
	// Endpoint is the server's URL (http://127.0.0.1:port).
	Endpoint string
	bin, dir string
	addr     string
	t        testing.TB
	cmd      *exec.Cmd
	done     chan struct{}
	logf     *os.File
}

// StartS3 starts the server of $SIDECAR_TEST_S3SERVER on a free loopback
// port with a data directory under t.TempDir(), and stops it (by its
// process) when the test ends. Without the variable the test is skipped,
// or fails under CI=true.
func StartS3(t testing.TB) *S3Server {
	t.Helper()
	bin := os.Getenv(EnvBinary)
	if bin == "" {
		msg := EnvBinary + " is not set: build the S3 server with deploy/local/s3server.sh and set " + EnvBinary + "=<dir>/versitygw"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	for _, d := range []string{"data", "meta"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "s3server.log"))
	if err != nil {
		t.Fatal(err)
	}
	s := &S3Server{bin: bin, dir: dir, addr: freeAddr(t), t: t, logf: logf}
	s.Endpoint = "http://" + s.addr
	t.Cleanup(func() {
		s.Stop()
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("s3 server log (tail):\n%s", tail(b, 4096))
		}
	})
	s.Start()
	return s
}

// Start starts the server if it is not running and returns once it
// answers HTTP.
func (s *S3Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	// The posix backend keeps object metadata in a sidecar directory, so
	// the data directory needs no extended attributes.
	cmd := exec.Command(s.bin, "--access", AccessKeyID, "--secret", SecretAccessKey,
		"--region", Region, "--port", s.addr, "--quiet",
		"posix", "--sidecar", filepath.Join(s.dir, "meta"), filepath.Join(s.dir, "data"))
	cmd.Stdout, cmd.Stderr = s.logf, s.logf
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.bin, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(s.done)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(s.logf.Name())
			s.t.Fatalf("s3 server exited at start:\n%s", tail(b, 4096))
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.logf.Name())
			s.t.Fatalf("s3 server not answering on %s after 30s:\n%s", s.Endpoint, tail(b, 4096))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the server's process and waits for it to exit.
func (s *S3Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Config returns the S3Config of bucket/prefix on the server, with its
// credentials and path-style addressing.
func (s *S3Server) Config(bucket, prefix string) archive.S3Config {
	return archive.S3Config{Bucket: bucket, Prefix: prefix, Endpoint: s.Endpoint, Region: Region,
		AccessKeyID: AccessKeyID, SecretAccessKey: SecretAccessKey, PathStyle: true}
}

// Env returns the AWS variables that point an s3:// URL at the server.
func (s *S3Server) Env() map[string]string {
	return map[string]string{
		"AWS_ENDPOINT_URL_S3":   s.Endpoint,
		"AWS_ACCESS_KEY_ID":     AccessKeyID,
		"AWS_SECRET_ACCESS_KEY": SecretAccessKey,
		"AWS_REGION":            Region,
	}
}

// Bucket makes a new bucket on the server (CreateBucket) and returns the
// Destination under prefix of it.
func (s *S3Server) Bucket(bucket, prefix string) *archive.S3 {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
		UsePathStyle: true,
	})
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		s.t.Fatalf("create bucket %s: %v", bucket, err)
	}
	d, err := archive.NewS3(ctx, s.Config(bucket, prefix))
	if err != nil {
		s.t.Fatal(err)
	}
	return d
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
