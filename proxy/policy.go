package proxy

import (
	"fmt"
	"net/netip"
)

// Mode is the network mode of a VM.
type Mode string

const (
	// ModeProxy (the default) lets the VM reach only the hosts that Policy.Allow or a secret's
	// Hosts name, through this proxy.
	ModeProxy Mode = "proxy"
	// ModeOpen lets the proxy reach any host that Policy.Deny and the special-address rule do not
	// refuse (the VM also has direct egress in this mode).
	ModeOpen Mode = "open"
	// ModeNone refuses everything.
	ModeNone Mode = "none"
)

// Policy is the egress policy as configured ([network] in the config file).
//
// In ModeProxy a destination is allowed when Allow or a secret's Hosts match it (secrets' hosts
// are implicitly allowed: a secret that may go to a host is useless if the host is unreachable).
// Deny wins over Allow in every mode. Independently of the mode, a resolved address that is
// private, loopback, link-local, CGNAT, unique-local, multicast, unspecified or a cloud metadata
// endpoint is refused unless an IP/CIDR entry of Allow (or of a secret's Hosts) contains it: a
// name entry such as "localhost" never unlocks 127.0.0.1.
type Policy struct {
	Mode  Mode     `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// PolicyError is a destination refused by the egress policy. IP is the zero Addr when the refusal
// was decided on the name alone.
type PolicyError struct {
	Host   string
	IP     netip.Addr
	Reason string
}

func (e *PolicyError) Error() string {
	if e.IP.IsValid() && e.IP.String() != e.Host {
		return fmt.Sprintf("egress to %s (%s) refused: %s", e.Host, e.IP, e.Reason)
	}
	return fmt.Sprintf("egress to %s refused: %s", e.Host, e.Reason)
}

// Rules is a compiled Policy. It is safe for concurrent use.
type Rules struct {
	mode  Mode
	allow HostList
	deny  HostList
}

// CompilePolicy checks p and compiles it together with the hosts of secrets, which ModeProxy
// allows implicitly. An empty Mode means ModeProxy. It fails on an unknown mode or an invalid
// pattern, naming it.
func CompilePolicy(p Policy, secrets []Secret) (*Rules, error) {
	mode := p.Mode
	if mode == "" {
		mode = ModeProxy
	}
	switch mode {
	case ModeProxy, ModeOpen, ModeNone:
	default:
		return nil, fmt.Errorf("compile policy: unknown network mode %q (want proxy, open or none)", p.Mode)
	}
	allowPatterns := append([]string(nil), p.Allow...)
	for _, s := range secrets {
		allowPatterns = append(allowPatterns, s.Hosts...)
	}
	allow, err := ParseHostList(allowPatterns)
	if err != nil {
		return nil, fmt.Errorf("compile policy: allow: %w", err)
	}
	deny, err := ParseHostList(p.Deny)
	if err != nil {
		return nil, fmt.Errorf("compile policy: deny: %w", err)
	}
	return &Rules{mode: mode, allow: allow, deny: deny}, nil
}

// Mode returns the compiled network mode.
func (r *Rules) Mode() Mode { return r.mode }

// CheckName decides what the host name alone decides. host is a name or an IP literal, without
// port. It returns a *PolicyError when host is refused whatever it resolves to, and nil when it may
// be allowed: the dialer must then call CheckIP for each resolved address. For an IP literal the
// answer is final.
func (r *Rules) CheckName(host string) error {
	h := normalizeHost(host)
	if ip, ok := parseIPLiteral(h); ok {
		return r.CheckIP(h, ip)
	}
	switch {
	case r.mode == ModeNone:
		return &PolicyError{Host: h, Reason: "the network mode is none"}
	case r.deny.MatchName(h):
		return &PolicyError{Host: h, Reason: "the host is on the deny list"}
	case r.mode == ModeProxy && !r.allow.MatchName(h) && !r.allow.HasCIDR():
		return &PolicyError{Host: h, Reason: notAllowedReason}
	}
	return nil
}

const notAllowedReason = "the host is not on the allow list (add it to [network] allow, or to the hosts of the secret it needs)"

// CheckIP is the authoritative decision for connecting to ip as the address of host (a name, or
// the same IP literal). It returns a *PolicyError or nil.
func (r *Rules) CheckIP(host string, ip netip.Addr) error {
	h := normalizeHost(host)
	ip = ip.WithZone("").Unmap()
	if r.mode == ModeNone {
		return &PolicyError{Host: h, IP: ip, Reason: "the network mode is none"}
	}
	if r.deny.MatchName(h) || r.deny.MatchIP(ip) {
		return &PolicyError{Host: h, IP: ip, Reason: "the host is on the deny list"}
	}
	explicit := r.allow.MatchIP(ip)
	if kind := SpecialAddress(ip); kind != "" && !explicit {
		return &PolicyError{Host: h, IP: ip, Reason: fmt.Sprintf(
			"%s address %s (allow it explicitly with an IP or CIDR entry in [network] allow)", kind, ip)}
	}
	if r.mode == ModeProxy && !explicit && !r.allow.MatchName(h) {
		return &PolicyError{Host: h, IP: ip, Reason: notAllowedReason}
	}
	return nil
}

// specialRanges are refused unless allowed explicitly by IP/CIDR. Order matters: the first match
// names the kind.
var specialRanges = []struct {
	prefix netip.Prefix
	kind   string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata"},
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud metadata"}, // Azure wire server
	{netip.MustParsePrefix("100.100.100.200/32"), "cloud metadata"},
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("100.64.0.0/10"), "CGNAT"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("fc00::/7"), "unique-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64"},
	{netip.MustParsePrefix("100::/64"), "discard"},
}

// SpecialAddress names the kind of a non-public address ("loopback", "private", "link-local",
// "CGNAT", "unique-local", "cloud metadata", …), or returns "" for an ordinary public address.
// IPv4-mapped IPv6 addresses are judged as IPv4.
func SpecialAddress(ip netip.Addr) string {
	ip = ip.WithZone("").Unmap()
	if !ip.IsValid() {
		return "invalid"
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(ip) {
			return r.kind
		}
	}
	return ""
}
