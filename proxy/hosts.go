package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// HostList is a compiled list of host patterns, as used by a secret's Hosts and by Policy.Allow
// and Policy.Deny. Three forms are accepted:
//
//   - "api.github.com": that host exactly (case-insensitive; a trailing dot and the port of the
//     destination are ignored).
//   - ".github.com": the bare domain github.com and every name below it (api.github.com,
//     a.b.github.com). "*.github.com" is rejected to avoid guessing whether the bare domain is meant.
//   - "10.0.0.0/8", "127.0.0.1", "::1", "[fd00::1]": an IP address or CIDR. It matches a destination
//     that is an IP literal inside it, or a destination name whose address, resolved at dial time,
//     is inside it.
//
// Patterns carry no port. The zero HostList matches nothing.
type HostList struct {
	src      []string
	exact    map[string]struct{}
	suffixes []string // lower-case domain without the leading dot
	prefixes []netip.Prefix
}

// ParseHostList compiles patterns (see HostList). It returns an error naming the first invalid
// pattern and how to write it instead.
func ParseHostList(patterns []string) (HostList, error) {
	l := HostList{exact: map[string]struct{}{}}
	for _, raw := range patterns {
		p := strings.TrimSpace(raw)
		if err := l.add(p); err != nil {
			return HostList{}, fmt.Errorf("host pattern %q: %w", raw, err)
		}
		l.src = append(l.src, p)
	}
	return l, nil
}

func (l *HostList) add(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("empty pattern")
	case strings.Contains(p, "/"):
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return fmt.Errorf("invalid CIDR: %w", err)
		}
		if pfx.Addr().Is4In6() {
			return fmt.Errorf("IPv4-mapped IPv6 CIDR: write the IPv4 form")
		}
		l.prefixes = append(l.prefixes, pfx.Masked())
		return nil
	case strings.HasPrefix(p, "*"):
		return fmt.Errorf("wildcards are not supported: write %q for a domain and everything below it", strings.TrimLeft(p, "*"))
	}
	if ip, ok := parseIPLiteral(p); ok {
		l.prefixes = append(l.prefixes, netip.PrefixFrom(ip, ip.BitLen()))
		return nil
	}
	name, suffix := strings.CutPrefix(p, ".")
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if err := validHostname(name); err != nil {
		return err
	}
	if suffix {
		l.suffixes = append(l.suffixes, name)
	} else {
		l.exact[name] = struct{}{}
	}
	return nil
}

// validHostname reports whether name (lower case, no trailing dot) is a DNS name of letters,
// digits, '-' and '_' labels.
func validHostname(name string) error {
	if name == "" {
		return fmt.Errorf("empty host name")
	}
	if strings.Contains(name, ":") {
		return fmt.Errorf("ports are not allowed in host patterns")
	}
	if len(name) > 253 {
		return fmt.Errorf("host name longer than 253 characters")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("invalid host name: empty or over-long label")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("invalid character %q in host name", c)
			}
		}
	}
	return nil
}

// parseIPLiteral parses an IP address, optionally in brackets, and unmaps IPv4-mapped IPv6.
func parseIPLiteral(s string) (netip.Addr, bool) {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// Patterns returns the patterns the list was compiled from.
func (l HostList) Patterns() []string { return slices.Clone(l.src) }

// String returns the patterns joined by ", ", for messages.
func (l HostList) String() string { return strings.Join(l.src, ", ") }

// Empty reports whether the list has no pattern.
func (l HostList) Empty() bool { return len(l.src) == 0 }

// HasCIDR reports whether the list has an IP or CIDR pattern, that is whether a host name that
// matches no name pattern may still match once resolved.
func (l HostList) HasCIDR() bool { return len(l.prefixes) > 0 }

// MatchName reports whether host (a name or an IP literal, without port) matches a name pattern,
// or, for an IP literal, an IP/CIDR pattern.
func (l HostList) MatchName(host string) bool {
	h := normalizeHost(host)
	if ip, ok := parseIPLiteral(h); ok {
		return l.MatchIP(ip)
	}
	if _, ok := l.exact[h]; ok {
		return true
	}
	for _, s := range l.suffixes {
		if h == s || strings.HasSuffix(h, "."+s) {
			return true
		}
	}
	return false
}

// MatchIP reports whether ip is inside an IP/CIDR pattern.
func (l HostList) MatchIP(ip netip.Addr) bool {
	ip = ip.WithZone("").Unmap()
	for _, p := range l.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// normalizeHost lower-cases host, strips IPv6 brackets and a trailing dot, and writes an IP literal
// in its canonical form.
func normalizeHost(host string) string {
	if ip, ok := parseIPLiteral(host); ok {
		return ip.String()
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// splitHostPortDefault splits "host:port" (or "host", taking defPort), normalizing the host. It
// fails on an empty host or a port that is not a number in 1..65535.
func splitHostPortDefault(hostport, defPort string) (host, port string, err error) {
	host, port = hostport, defPort
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		host = hostport[1 : len(hostport)-1]
	} else if strings.HasPrefix(hostport, "[") || strings.Count(hostport, ":") == 1 {
		return "", "", fmt.Errorf("split host and port of %q: %w", hostport, err)
	}
	host = normalizeHost(host)
	if _, ok := parseIPLiteral(host); !ok {
		if err := validHostname(host); err != nil {
			return "", "", fmt.Errorf("host of %q: %w", hostport, err)
		}
	}
	if !validPort(port) {
		return "", "", fmt.Errorf("invalid port in %q", hostport)
	}
	return host, port, nil
}

func validPort(p string) bool {
	if p == "" || len(p) > 5 {
		return false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n >= 1 && n <= 65535
}
