package exec

import (
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
