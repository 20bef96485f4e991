package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestHostListParse(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"":                    "empty",
		"*.github.com":        "wildcards",
		"api.github.com:443":  "ports",
		"a..b":                "label",
		"exa mple.com":        "character",
		"10.0.0.0/33":         "CIDR",
		"::ffff:10.0.0.0/104": "IPv4-mapped",
	}
	for p, want := range bad {
		_, err := ParseHostList([]string{p})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHostList(%q) = %v, want error mentioning %q", p, err, want)
		}
	}
	if _, err := ParseHostList([]string{"API.GitHub.com.", ".pypi.org", "10.0.0.0/8", "127.0.0.1", "[::1]", "fd00::/8"}); err != nil {
		t.Fatal(err)
	}
}

func TestHostListMatch(t *testing.T) {
	t.Parallel()
	l, err := ParseHostList([]string{"api.github.com", ".githubusercontent.com", "10.0.0.0/8", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"api.github.com":            true,
		"API.GitHub.COM":            true,
		"api.github.com.":           true,
		"github.com":                false,
		"evil-api.github.com":       false,
		"api.github.com.evil.com":   false,
		"githubusercontent.com":     true, // the bare domain of a .suffix entry
		"raw.githubusercontent.com": true,
		"a.b.githubusercontent.com": true,
		"evilgithubusercontent.com": false,
		"10.1.2.3":                  true, // IP literal inside a CIDR
		"11.0.0.1":                  false,
		"::1":                       true,
		"[::1]":                     true,
		"::ffff:10.0.0.1":           true, // mapped IPv4 judged as IPv4
		"ten.example":               false,
	} {
		if got := l.MatchName(host); got != want {
			t.Errorf("MatchName(%q) = %v, want %v", host, got, want)
		}
	}
	if !l.MatchIP(netip.MustParseAddr("10.200.0.1")) || l.MatchIP(netip.MustParseAddr("192.168.0.1")) {
		t.Errorf("MatchIP wrong")
	}
	if !l.HasCIDR() || l.Empty() {
		t.Errorf("HasCIDR/Empty wrong")
	}
}

func TestSpecialAddress(t *testing.T) {
	t.Parallel()
	for ip, want := range map[string]string{
		"169.254.169.254":  "cloud metadata",
		"fd00:ec2::254":    "cloud metadata",
		"127.0.0.1":        "loopback",
		"127.255.0.9":      "loopback",
		"::1":              "loopback",
		"10.1.2.3":         "private",
		"172.16.0.1":       "private",
		"172.31.255.255":   "private",
		"192.168.1.1":      "private",
		"169.254.1.1":      "link-local",
		"fe80::1":          "link-local",
		"fe80::1%eth0":     "link-local",
		"100.64.0.1":       "CGNAT",
		"fd12:3456::1":     "unique-local",
		"fc00::1":          "unique-local",
		"0.0.0.0":          "unspecified",
		"::":               "unspecified",
		"::ffff:127.0.0.1": "loopback",
		"64:ff9b::a00:1":   "NAT64",
		"224.0.0.1":        "multicast",
		"8.8.8.8":          "",
		"140.82.112.3":     "",
		"172.32.0.1":       "",
		"2606:4700::1111":  "",
	} {
		if got := SpecialAddress(netip.MustParseAddr(ip)); got != want {
			t.Errorf("SpecialAddress(%s) = %q, want %q", ip, got, want)
		}
	}
}

func TestRulesDecisions(t *testing.T) {
	t.Parallel()
	secrets := []Secret{{Name: "S", Hosts: []string{"api.secret.example", "192.168.7.0/24"}}}
	rules := func(p Policy) *Rules {
		r, err := CompilePolicy(p, secrets)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	proxyMode := rules(Policy{Allow: []string{".pypi.org", "registry.npmjs.org", "127.0.0.1/32", "10.9.0.0/16"}, Deny: []string{"evil.pypi.org", "10.9.9.0/24"}})
	open := rules(Policy{Mode: ModeOpen, Deny: []string{".blocked.example"}})
	none := rules(Policy{Mode: ModeNone, Allow: []string{"x.example"}})
	ip := netip.MustParseAddr

	type tc struct {
		r       *Rules
		host    string
		ip      string // "" → CheckName only
		allowed bool
		reason  string
	}
	cases := map[string]tc{
		"allowed name, public IP":          {proxyMode, "files.pypi.org", "151.101.0.223", true, ""},
		"bare suffix domain":               {proxyMode, "pypi.org", "151.101.0.223", true, ""},
		"secret host implicitly allowed":   {proxyMode, "api.secret.example", "140.82.112.3", true, ""},
		"secret CIDR unlocks private":      {proxyMode, "internal.example", "192.168.7.9", true, ""},
		"not on the allow list":            {proxyMode, "example.com", "93.184.215.14", false, "allow list"},
		"deny wins over suffix allow":      {proxyMode, "evil.pypi.org", "151.101.0.223", false, "deny"},
		"deny CIDR wins over allow CIDR":   {proxyMode, "x.example", "10.9.9.1", false, "deny"},
		"allow CIDR by resolved IP":        {proxyMode, "x.example", "10.9.1.1", true, ""},
		"allowed name, metadata IP":        {proxyMode, "files.pypi.org", "169.254.169.254", false, "cloud metadata"},
		"allowed name, private IP":         {proxyMode, "files.pypi.org", "10.0.0.5", false, "private"},
		"allowed name, loopback":           {proxyMode, "files.pypi.org", "127.0.0.2", false, "loopback"},
		"allowed name, link-local v6":      {proxyMode, "files.pypi.org", "fe80::1", false, "link-local"},
		"allowed name, ULA metadata v6":    {proxyMode, "files.pypi.org", "fd00:ec2::254", false, "cloud metadata"},
		"allowed name, CGNAT":              {proxyMode, "files.pypi.org", "100.64.1.1", false, "CGNAT"},
		"loopback explicitly allowed":      {proxyMode, "localhost", "127.0.0.1", true, ""},
		"mapped loopback not allowed":      {proxyMode, "files.pypi.org", "::ffff:127.0.0.2", false, "loopback"},
		"open mode public":                 {open, "anything.example", "93.184.215.14", true, ""},
		"open mode still refuses metadata": {open, "anything.example", "169.254.169.254", false, "cloud metadata"},
		"open mode private":                {open, "anything.example", "192.168.1.1", false, "private"},
		"open mode deny":                   {open, "a.blocked.example", "93.184.215.14", false, "deny"},
		"none mode":                        {none, "x.example", "93.184.215.14", false, "none"},
		// CheckName alone
		"name: deny":                 {proxyMode, "evil.pypi.org", "", false, "deny"},
		"name: allowed":              {proxyMode, "files.pypi.org", "", true, ""},
		"name: undecided with CIDRs": {proxyMode, "unknown.example", "", true, ""},
		"name: metadata IP literal":  {proxyMode, "169.254.169.254", "", false, "cloud metadata"},
		"name: private IP literal":   {proxyMode, "[fd00::1]", "", false, "unique-local"},
		"name: allowed IP literal":   {proxyMode, "127.0.0.1", "", true, ""},
		"name: open":                 {open, "x.example", "", true, ""},
		"name: none":                 {none, "x.example", "", false, "none"},
	}
	for name, c := range cases {
		var err error
		if c.ip == "" {
			err = c.r.CheckName(c.host)
		} else {
			err = c.r.CheckIP(c.host, ip(c.ip))
		}
		if (err == nil) != c.allowed {
			t.Errorf("%s: err = %v, want allowed=%v", name, err, c.allowed)
			continue
		}
		var pe *PolicyError
		if err != nil && (!errors.As(err, &pe) || !strings.Contains(pe.Reason, c.reason)) {
			t.Errorf("%s: err = %v, want a PolicyError mentioning %q", name, err, c.reason)
		}
	}

	// Without any CIDR entry, proxy mode refuses an unknown name before resolving it.
	strict, _ := CompilePolicy(Policy{Allow: []string{"api.example"}}, nil)
	if err := strict.CheckName("other.example"); err == nil {
		t.Errorf("strict: unknown name passed CheckName")
	}
	if _, err := CompilePolicy(Policy{Mode: "bogus"}, nil); err == nil {
		t.Errorf("unknown mode accepted")
	}
	if r, _ := CompilePolicy(Policy{}, nil); r.Mode() != ModeProxy {
		t.Errorf("default mode = %q, want proxy", r.Mode())
	}
}

// failDialer must never be reached: it records the attempt and refuses it without connecting.
type failDialer struct{ attempts []string }

func (d *failDialer) DialContext(_ context.Context, _, address string) (net.Conn, error) {
	d.attempts = append(d.attempts, address)
	return nil, errors.New("failDialer: no connections in this test")
}

func TestPolicyDialerChecksResolvedAddress(t *testing.T) {
	t.Parallel()
	rules, err := CompilePolicy(Policy{Allow: []string{"public.example", "mixed.example", "ok.example"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := mapResolver{
		// A public-looking name re-bound to a private address, and to the metadata service.
		"public.example": {netip.MustParseAddr("10.0.0.5")},
		"mixed.example":  {netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")},
		"ok.example":     {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("93.184.215.14")},
	}
	for _, addr := range []string{"public.example:443", "mixed.example:80", "169.254.169.254:80", "[::1]:22", "not-allowed.example:443"} {
		d := &failDialer{}
		pd := &PolicyDialer{Rules: rules, Resolver: res, Dialer: d}
		_, err := pd.DialContext(context.Background(), "tcp", addr)
		var pe *PolicyError
		if !errors.As(err, &pe) {
			t.Errorf("%s: err = %v, want a PolicyError", addr, err)
		}
		if len(d.attempts) != 0 {
			t.Errorf("%s: dialer reached with %v", addr, d.attempts)
		}
	}
	// Only the allowed address of a mixed answer reaches the dialer (which refuses it anyway).
	d := &failDialer{}
	pd := &PolicyDialer{Rules: rules, Resolver: res, Dialer: d}
	if _, err := pd.DialContext(context.Background(), "tcp", "ok.example:443"); err == nil {
		t.Fatal("failDialer connected")
	}
	if len(d.attempts) != 1 || d.attempts[0] != "93.184.215.14:443" {
		t.Errorf("attempts %v, want only the public address", d.attempts)
	}
	if _, err := pd.DialContext(context.Background(), "udp", "ok.example:53"); err == nil {
		t.Errorf("udp accepted")
	}
}
