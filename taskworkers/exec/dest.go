package exec

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Destination is an entry of Options.HTTPAllow or Options.HTTPDeny: a CIDR
// prefix, or a host (a name or an IP literal) with an optional port.
type Destination struct {
	// Prefix is set for a CIDR entry; it matches any port.
	Prefix netip.Prefix
	// Host is a host name (lower case, no trailing dot) or an IP literal.
	// A name matches a request to that name (whatever it resolves to); an
	// IP matches that address.
	Host string
	// Port, when not 0, restricts a Host entry to one port.
	Port uint16
}

// ParseDestination parses "10.0.0.0/8", "fd00::/8", "127.0.0.1",
// "127.0.0.1:9000", "[::1]:9000", "api.internal" or "api.internal:8443".
func ParseDestination(s string) (Destination, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Destination{}, errors.New("empty destination")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Destination{}, fmt.Errorf("%q is not a CIDR: %w", s, err)
		}
		return Destination{Prefix: p.Masked()}, nil
	}
	if ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return Destination{Host: ip.Unmap().String()}, nil
	}
	host, port := s, uint16(0)
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return Destination{}, fmt.Errorf("%q: port %q is not 1-65535", s, p)
		}
		host, port = h, uint16(n)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return Destination{Host: ip.Unmap().String(), Port: port}, nil
	}
	host = normHost(host)
	if !validHostName(host) {
		return Destination{}, fmt.Errorf("%q is neither a CIDR nor a host[:port]", s)
	}
	return Destination{Host: host, Port: port}, nil
}

// String returns d in ParseDestination's syntax.
func (d Destination) String() string {
	switch {
	case d.Prefix.IsValid():
		return d.Prefix.String()
	case d.Port != 0:
		return net.JoinHostPort(d.Host, strconv.Itoa(int(d.Port)))
	}
	return d.Host
}

func normHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// Special-purpose IPv4 ranges that netip's predicates do not name.
var reservedV4 = []struct {
	p     netip.Prefix
	class string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"}, // "this network": 0.x reaches the local host on Linux
	{netip.MustParsePrefix("100.64.0.0/10"), "private"}, // shared address space (CGNAT; some clouds' metadata)
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved"}, // benchmarking
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},   // incl. 255.255.255.255
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	nat64Loc  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour = netip.MustParsePrefix("2002::/16")
	v4Compat  = netip.MustParsePrefix("::/96")
	siteLocal = netip.MustParsePrefix("fec0::/10")
)

// addrClass returns why ip is forbidden by default ("loopback",
// "link-local", "private", "unspecified", "multicast", "reserved",
// "invalid"), or "" for a public address. IPv4 addresses carried in IPv6
// (mapped, compatible, NAT64, 6to4) are classified as the IPv4 address.
func addrClass(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		b := ip.As16()
		var v4 [4]byte
		switch {
		case nat64.Contains(ip), v4Compat.Contains(ip) && !ip.IsUnspecified() && !ip.IsLoopback():
			copy(v4[:], b[12:])
			return addrClass(netip.AddrFrom4(v4))
		case sixToFour.Contains(ip):
			copy(v4[:], b[2:6])
			return addrClass(netip.AddrFrom4(v4))
		case nat64Loc.Contains(ip), siteLocal.Contains(ip):
			return "private"
		}
	}
	switch {
	case !ip.IsValid():
		return "invalid"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "link-local"
	case ip.IsMulticast():
		return "multicast"
	case ip.IsPrivate():
		return "private"
	}
	if ip.Is4() {
		for _, r := range reservedV4 {
			if r.p.Contains(ip) {
				return r.class
			}
		}
	}
	return ""
}

// resolver is what the guard needs of *net.Resolver.
type resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// destGuard decides which addresses the http executor may connect to.
type destGuard struct {
	allow, deny []Destination
	// denyOnly: only deny is checked, any other address may be reached
	// (NewDenyingTransport's guard).
	denyOnly bool
	resolver resolver
	// localAddrs returns this machine's interface addresses.
	localAddrs func() []netip.Addr
}

func interfaceAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// isLocal reports whether ip reaches this machine.
func (g *destGuard) isLocal(ip netip.Addr, locals *[]netip.Addr) bool {
	if ip.IsLoopback() || ip.IsUnspecified() || addrClass(ip) == "unspecified" {
		return true
	}
	if *locals == nil {
		*locals = append(g.localAddrs(), netip.Addr{}) // non-nil: looked up once
	}
	for _, l := range *locals {
		if l == ip {
			return true
		}
	}
	return false
}

// check returns nil when host (as the request named it) may be reached at
// ap, else a *DestinationError (or an error resolving a denied host name:
// the guard fails closed).
func (g *destGuard) check(ctx context.Context, host string, ap netip.AddrPort) error {
	if err := g.denied(ctx, host, ap); err != nil || g.denyOnly {
		return err
	}
	host = normHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	ip, port := ap.Addr().Unmap().WithZone(""), ap.Port()
	class := addrClass(ip)
	if class == "" {
		return nil
	}
	for _, a := range g.allow {
		if a.Port != 0 && a.Port != port {
			continue
		}
		if a.Prefix.IsValid() && a.Prefix.Contains(ip) || a.Host != "" && (a.Host == host || a.Host == ip.String()) {
			return nil
		}
	}
	return &DestinationError{Host: host, Addr: ap, Reason: class}
}

// denied returns a *DestinationError when ap (which host, as a request
// named it, resolved to) is one of g.deny: the same address, or a local
// address on a denied local address's port. A denied host name that
// cannot be resolved is an error (fail closed).
func (g *destGuard) denied(ctx context.Context, host string, ap netip.AddrPort) error {
	host = normHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	ip, port := ap.Addr().Unmap().WithZone(""), ap.Port()
	var locals []netip.Addr
	for _, d := range g.deny {
		if d.Port != 0 && d.Port != port {
			continue
		}
		denied := func() error {
			return &DestinationError{Host: host, Addr: ap, Always: true, Reason: "it is one of the sidecar's own listeners (API, pprof, NATS) or Conductor (" + d.String() + ")"}
		}
		if d.Prefix.IsValid() {
			if d.Prefix.Contains(ip) {
				return denied()
			}
			continue
		}
		if host == d.Host {
			return denied()
		}
		var ips []netip.Addr
		if dip, err := netip.ParseAddr(d.Host); err == nil {
			ips = []netip.Addr{dip}
		} else {
			var err error
			if ips, err = g.resolver.LookupNetIP(ctx, "ip", d.Host); err != nil {
				return fmt.Errorf("resolve %s to check that the request does not reach it: %w", d.Host, err)
			}
		}
		for _, dip := range ips {
			dip = dip.Unmap().WithZone("")
			if dip == ip || g.isLocal(dip, &locals) && g.isLocal(ip, &locals) {
				return denied()
			}
		}
	}
	return nil
}

// CheckDenied reports whether a connection to host (a name or an IP
// literal) on port would reach one of deny, by the http executor's rules
// for always-denied destinations (Options.HTTPDeny): it returns a
// *DestinationError naming the first match, an error when host or a
// denied name cannot be resolved (fail closed), or nil. serve uses it to
// refuse an event bus webhook that would deliver to the sidecar itself.
func CheckDenied(ctx context.Context, host string, port uint16, deny []Destination) error {
	g := &destGuard{deny: deny, resolver: net.DefaultResolver, localAddrs: interfaceAddrs}
	bare := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(bare); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", bare); err != nil {
		return fmt.Errorf("resolve %s: %w", bare, err)
	}
	for _, ip := range ips {
		if err := g.denied(ctx, host, netip.AddrPortFrom(ip, port)); err != nil {
			return err
		}
	}
	return nil
}

// dialContext resolves addr itself, refuses it when no address it resolves
// to may be reached, and dials the allowed addresses one by one. The
// dialer checks the address of every socket again right before connect
// (ControlContext), so what is checked is what is dialled.
func (g *destGuard) dialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", portStr, err)
		}
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{ip}
		} else {
			ipNet := "ip"
			switch network {
			case "tcp4":
				ipNet = "ip4"
			case "tcp6":
				ipNet = "ip6"
			}
			if ips, err = g.resolver.LookupNetIP(ctx, ipNet, host); err != nil {
				return nil, &net.OpError{Op: "dial", Net: network, Err: err}
			}
		}
		var allowed []netip.AddrPort
		var refused error
		for _, ip := range ips {
			ap := netip.AddrPortFrom(ip, uint16(port))
			if err := g.check(ctx, host, ap); err != nil {
				if refused == nil {
					refused = err
				}
				continue
			}
			allowed = append(allowed, ap)
		}
		if len(allowed) == 0 {
			if refused == nil {
				refused = fmt.Errorf("%s resolves to no address", host)
			}
			return nil, &net.OpError{Op: "dial", Net: network, Err: refused}
		}
		dd := *d
		dd.ControlContext = func(ctx context.Context, _, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dialled address %q: %w", address, err)
			}
			return g.check(ctx, host, ap)
		}
		var first error
		for _, ap := range allowed {
			c, err := dd.DialContext(ctx, network, ap.String())
			if err == nil {
				return c, nil
			}
			if first == nil {
				first = err
			}
			if ctx.Err() != nil {
				break
			}
		}
		return nil, first
	}
}

// NewDenyingTransport returns an HTTP transport (Go's default settings,
// no proxy) whose every connection is refused, with a *DestinationError,
// when it would reach one of deny by CheckDenied's rules: a name is
// resolved when it is dialled, so a name that did not resolve before,
// or resolves elsewhere now, is checked as it is. serve's event bus
// webhooks use it, so that none delivers the log to the sidecar itself.
func NewDenyingTransport(deny []Destination) *http.Transport {
	g := &destGuard{deny: deny, denyOnly: true, resolver: net.DefaultResolver, localAddrs: interfaceAddrs}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialTLSContext = nil
	t.DialContext = g.dialContext(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
	return t
}

// newGuardedClient returns the http executor's client: Go's default
// transport settings, no proxy (HTTP_PROXY and friends are ignored, so a
// proxy cannot carry a request past the guard), and a dialer guarded by
// allow and deny. Redirects are followed as Go does by default; each new
// connection, a redirect's included, passes the guard.
func newGuardedClient(allow, deny []Destination) *http.Client {
	g := &destGuard{allow: allow, deny: deny, resolver: net.DefaultResolver, localAddrs: interfaceAddrs}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialTLSContext = nil
	t.DialContext = g.dialContext(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
	return &http.Client{Transport: t}
}
