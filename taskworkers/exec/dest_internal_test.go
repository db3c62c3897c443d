package exec

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

func TestAddrClass(t *testing.T) {
	tests := []struct {
		ip   string
		want string
	}{
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"2606:4700:4700::1111", ""},
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"169.254.169.254", "link-local"}, // cloud metadata
		{"169.254.0.1", "link-local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"ff02::1", "link-local"},
		{"10.0.0.1", "private"},
		{"10.255.255.255", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"172.32.0.1", ""},
		{"172.15.255.255", ""},
		{"192.168.1.1", "private"},
		{"::ffff:10.1.2.3", "private"},
		{"::ffff:100.64.0.1", "private"}, // mapped, in a range netip has no predicate for
		{"::ffff:255.255.255.255", "reserved"},
		{"fc00::1", "private"},
		{"fd12:3456::1", "private"},
		{"fec0::1", "private"},
		{"100.64.0.1", "private"},
		{"100.100.100.200", "private"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"224.0.0.1", "link-local"}, // link-local multicast
		{"224.0.1.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"ff05::1", "multicast"},
		{"255.255.255.255", "reserved"},
		{"240.0.0.1", "reserved"},
		{"198.18.0.1", "reserved"},
		{"192.0.0.8", "reserved"},
		{"64:ff9b::7f00:1", "loopback"},      // NAT64 of 127.0.0.1
		{"64:ff9b::a9fe:a9fe", "link-local"}, // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", ""},             // NAT64 of 8.8.8.8
		{"64:ff9b:1::1", "private"},
		{"2002:7f00:1::1", "loopback"}, // 6to4 of 127.0.0.1
		{"2002:0a00:1::1", "private"},  // 6to4 of 10.0.0.1
		{"2002:0808:0808::1", ""},
		{"::127.0.0.1", "loopback"}, // IPv4-compatible
		{"::10.0.0.1", "private"},
	}
	for _, tt := range tests {
		t.Run(tt.ip, func(t *testing.T) {
			if got := addrClass(netip.MustParseAddr(tt.ip)); got != tt.want {
				t.Errorf("addrClass(%s) = %q, want %q", tt.ip, got, tt.want)
			}
		})
	}
	if got := addrClass(netip.Addr{}); got != "invalid" {
		t.Errorf("zero Addr: got %q", got)
	}
}

// fakeResolver answers LookupNetIP from a map; a missing name fails.
type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if ips, ok := f[host]; ok {
		return ips, nil
	}
	return nil, errors.New("no such host")
}

func TestDestGuard_Check(t *testing.T) {
	ap := netip.MustParseAddrPort
	pub := netip.MustParseAddr("203.0.113.7")
	tests := []struct {
		name        string
		allow, deny []Destination
		res         fakeResolver
		host        string
		addr        netip.AddrPort
		want        string // "" allowed, "always", "class", "error" (not a DestinationError)
	}{
		{"Public", nil, nil, nil, "example.com", ap("203.0.113.7:443"), ""},
		{"Private", nil, nil, nil, "db", ap("10.0.0.5:5432"), "class"},
		// The request names Conductor's host: denied before (and without)
		// resolving it, even when DNS for it fails.
		{"DenyByNameUnresolvable", nil, []Destination{{Host: "conductor.internal", Port: 8080}}, fakeResolver{}, "Conductor.Internal.", ap("203.0.113.7:8080"), "always"},
		{"DenyByResolvedIP", nil, []Destination{{Host: "conductor.internal", Port: 8080}}, fakeResolver{"conductor.internal": {pub}}, "alias.example", ap("203.0.113.7:8080"), "always"},
		{"DenyOtherPort", nil, []Destination{{Host: "conductor.internal", Port: 8080}}, fakeResolver{"conductor.internal": {pub}}, "alias.example", ap("203.0.113.7:443"), ""},
		{"DenyUnresolvableFailsClosed", nil, []Destination{{Host: "conductor.internal", Port: 8080}}, fakeResolver{}, "other.example", ap("203.0.113.9:8080"), "error"},
		{"DenyPrefix", []Destination{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}, []Destination{{Prefix: netip.MustParsePrefix("10.9.0.0/16")}}, nil, "x", ap("10.9.1.1:80"), "always"},
		{"DenyUnspecifiedCoversLoopback", []Destination{{Prefix: netip.MustParsePrefix("127.0.0.0/8")}}, []Destination{{Host: "::", Port: 8787}}, nil, "x", ap("127.0.0.1:8787"), "always"},
		{"DenyInterfaceAddrCoversLoopback", []Destination{{Prefix: netip.MustParsePrefix("127.0.0.0/8")}}, []Destination{{Host: "192.0.2.10", Port: 8787}}, nil, "x", ap("127.0.0.1:8787"), "always"},
		{"AllowByIPHost", []Destination{{Host: "10.0.0.5"}}, nil, nil, "db", ap("10.0.0.5:5432"), ""},
		{"AllowByIPHostMapped", []Destination{{Host: "10.0.0.5"}}, nil, nil, "db", ap("[::ffff:10.0.0.5]:5432"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &destGuard{allow: tt.allow, deny: tt.deny, resolver: tt.res,
				localAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.10")} }}
			err := g.check(context.Background(), tt.host, tt.addr)
			var de *DestinationError
			got := ""
			switch {
			case err == nil:
			case errors.As(err, &de) && de.Always:
				got = "always"
			case errors.As(err, &de):
				got = "class"
			default:
				got = "error"
			}
			if got != tt.want {
				t.Errorf("check(%s, %s) = %v (%s), want %s", tt.host, tt.addr, err, got, tt.want)
			}
		})
	}
}
