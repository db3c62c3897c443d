// Package archivetest runs a real S3-compatible server for tests: the
// versitygw gateway (posix backend) that deploy/local/s3server.sh builds,
// on a free loopback port and a directory of the test's own.
package archivetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/proctest"
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
	proc     *proctest.Process // nil while stopped
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
	s := &S3Server{bin: bin, dir: dir, addr: proctest.FreeAddr(t), t: t}
	s.Endpoint = "http://" + s.addr
	t.Cleanup(s.Stop)
	s.Start()
	return s
}

// Start starts the server if it is not running and returns once it
// listens.
func (s *S3Server) Start() {
	s.t.Helper()
	if s.proc != nil {
		return
	}
	// The posix backend keeps object metadata in a sidecar directory, so
	// the data directory needs no extended attributes. --keep-alive: the
	// server closes every connection after one request without it (its
	// default), which S3 services do not.
	cmd := exec.Command(s.bin, "--access", AccessKeyID, "--secret", SecretAccessKey,
		"--region", Region, "--port", s.addr, "--quiet", "--keep-alive",
		"posix", "--sidecar", filepath.Join(s.dir, "meta"), filepath.Join(s.dir, "data"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir}
	s.proc = proctest.Start(s.t, cmd, proctest.Options{Log: filepath.Join(s.dir, "s3server.log")}, s.addr)
}

// Stop kills the server's process and waits for it to exit.
func (s *S3Server) Stop() {
	if s.proc == nil {
		return
	}
	s.proc.Stop()
	s.proc = nil
}

// Freeze stops the server's process (SIGSTOP): it keeps its port and
// accepts connections, and answers nothing until thaw (also run when the
// test ends). A server that hangs, as one overloaded or partitioned does.
func (s *S3Server) Freeze() (thaw func()) {
	s.t.Helper()
	if s.proc == nil {
		s.t.Fatal("freeze: the S3 server is not running")
	}
	return proctest.Freeze(s.t, s.proc.Cmd.Process.Pid)
}

// ObjectFile returns the file the server keeps the object of key in
// bucket in (its posix backend: the data directory, the bucket, the key's
// path): a test changes the object's bytes there, behind the server's back.
func (s *S3Server) ObjectFile(bucket, key string) string {
	return filepath.Join(s.dir, "data", bucket, filepath.FromSlash(key))
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
