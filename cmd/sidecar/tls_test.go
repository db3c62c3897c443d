package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files in dir.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t *testing.T, clientCN string) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(cn+".pem", "CERTIFICATE", der), write(cn+".key", "EC PRIVATE KEY", kder)
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.clientCert, p.clientKey = leaf(3, clientCN, x509.ExtKeyUsageClientAuth, nil)
	return p
}

func (p testPKI) clientTLS(t *testing.T, withCert bool) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	b, _ := os.ReadFile(p.ca)
	pool.AppendCertsFromPEM(b)
	c := &tls.Config{RootCAs: pool}
	if withCert {
		cert, err := tls.LoadX509KeyPair(p.clientCert, p.clientKey)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}

// TestAPIConfig_TLS: --tls-cert/--tls-key serve TLS, and with --client-ca a
// verified client certificate whose common name is in the tokens file is
// that principal (mTLS); without one the caller needs a token.
func TestAPIConfig_TLS(t *testing.T) {
	pki := newTestPKI(t, "ops.example.com")
	tokens := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("principals:\n  - name: ops\n    certCommonName: ops.example.com\n    roles: [viewer]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := apiConfig{TokensFile: tokens, TLSCert: pki.serverCert, TLSKey: pki.serverKey, ClientCA: pki.ca}
	if p := cfg.validate("0.0.0.0:8787"); len(p) != 0 {
		t.Fatalf("validate: %v", p)
	}
	store := memstore.New(statestore.ProjectorOptions{})
	opts := httpapi.Options{Log: store, Logger: zaptest.NewLogger(t)}
	if err := cfg.apply(&opts, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	api := httpapi.NewServer(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api.Open(ln)
	t.Cleanup(func() { _ = api.Close(context.Background()) })
	url := "https://" + ln.Addr().String() + "/v1/runs/none"
	get := func(c *tls.Config) int {
		resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: c}}).Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(pki.clientTLS(t, true)); code != http.StatusNotFound {
		t.Fatalf("with the client certificate: %d, want 404 (authenticated, no such run)", code)
	}
	if code := get(pki.clientTLS(t, false)); code != http.StatusUnauthorized {
		t.Fatalf("without a client certificate or token: %d, want 401", code)
	}
	if resp, err := http.Get("http://" + ln.Addr().String() + "/healthz"); err == nil && resp.StatusCode == http.StatusOK {
		t.Fatal("plain HTTP answered on the TLS listener")
	}
}

// TestNATSConfig_TLS: --nats-ca, --nats-cert and --nats-key reach a NATS
// server that verifies client certificates, with a password user.
func TestNATSConfig_TLS(t *testing.T) {
	pki := newTestPKI(t, "sidecar")
	serverTLS, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.serverCert, KeyFile: pki.serverKey, CaFile: pki.ca, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, TLSConfig: serverTLS, TLSVerify: true, TLS: true,
		Users: []*server.User{{Username: "sidecar", Password: "pw"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server with TLS not ready")
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := "tls://" + srv.Addr().String()
	cfg := natsConfig{PasswordFile: pw, CA: pki.ca, Cert: pki.clientCert, Key: pki.clientKey}
	if p := cfg.validate(url); len(p) != 0 {
		t.Fatalf("validate: %v", p)
	}
	opts, err := cfg.connectOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect with the client certificate: %v", err)
	}
	nc.Close()
	noCert := natsConfig{PasswordFile: pw, CA: pki.ca}
	opts, _ = noCert.connectOptions()
	if nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...); err == nil {
		nc.Close()
		t.Fatal("connected without the client certificate the server requires")
	}
}

// A client that opens connections to the TLS listener and sends no
// handshake (a port scanner, a health check speaking TCP) makes the HTTP
// server log a handshake error each; the log passes one a minute.
func TestAPIConfig_TLSHandshakeErrorsLoggedBounded(t *testing.T) {
	pki := newTestPKI(t, "ops.example.com")
	cfg := apiConfig{TLSCert: pki.serverCert, TLSKey: pki.serverKey}
	core, logs := observer.New(zap.InfoLevel)
	opts := httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Logger: zap.New(core)}
	if err := cfg.apply(&opts, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	api := httpapi.NewServer(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api.Open(ln)
	for range 10 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte{0, 1, 2, 3, 4, 5, 6, 7})
		_, _ = c.Read(make([]byte, 1)) // until the server closes it
		c.Close()
	}
	_ = api.Close(context.Background()) // every connection's line written
	if n := logs.FilterMessageSnippet("TLS handshake error").Len(); n != 1 {
		t.Fatalf("%d handshake errors logged for 10 connections, want 1: %v", n, logs.All())
	}
}
