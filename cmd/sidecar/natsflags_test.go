package main

import (
	"strings"
	"testing"
)

func TestNATSConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		cfg       natsConfig
		want      string // substring of the one problem; "" for none
	}{
		{"EmbeddedDefault", "", natsConfig{}, ""},
		{"ListenNeedsPassword", "", natsConfig{Listen: "127.0.0.1:4222"}, "--nats-password-file"},
		{"ListenWithPassword", "", natsConfig{Listen: "10.0.0.5:4222", PasswordFile: "f"}, ""},
		{"CredsForEmbedded", "", natsConfig{Creds: "c"}, "external server"},
		{"RemoteWithoutCredentials", "nats://nats.prod:4222", natsConfig{}, "not on loopback"},
		{"RemoteInsecure", "nats://nats.prod:4222", natsConfig{InsecureNoAuth: true}, ""},
		{"RemoteWithCreds", "nats://a:4222,nats://b:4222", natsConfig{Creds: "c"}, ""},
		{"LoopbackWithoutCredentials", "nats://127.0.0.1:4222", natsConfig{}, ""},
		{"TwoCredentials", "nats://a:4222", natsConfig{Creds: "c", NKey: "k"}, "one of"},
		{"CertWithoutKey", "nats://a:4222", natsConfig{Creds: "c", Cert: "x"}, "go together"},
		{"ListenWithURL", "nats://a:4222", natsConfig{Creds: "c", Listen: "127.0.0.1:1"}, "embedded server"},
		{"CredentialsInURL", "nats://u:secret@nats.prod:4222", natsConfig{}, ""},
		{"CredentialsInOneURLOnly", "nats://u:secret@a:4222,nats://b:4222", natsConfig{}, "not on loopback"},
		// Without a scheme a server is nats://, as nats.go takes it.
		{"LoopbackWithoutScheme", "127.0.0.1:4222", natsConfig{}, ""},
		{"RemoteWithoutScheme", "nats.prod:4222", natsConfig{}, "not on loopback"},
		{"HTTPScheme", "http://u:secret@127.0.0.1:4222", natsConfig{}, "want nats://host:port"},
		{"NoHost", "nats://127.0.0.1:4222,nats://", natsConfig{}, "want nats://host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.cfg.validate(tc.url)
			switch {
			case tc.want == "" && len(p) != 0:
				t.Fatalf("problems %v, want none", p)
			case tc.want != "" && (len(p) != 1 || !strings.Contains(p[0], tc.want)):
				t.Fatalf("problems %v, want one naming %q", p, tc.want)
			}
			if len(p) > 0 && strings.Contains(p[0], "secret") {
				t.Fatalf("a problem shows the URL's password: %q", p[0])
			}
		})
	}
}
