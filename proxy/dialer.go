package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Resolver resolves host names. *net.Resolver implements it; tests give their own to map names to
// loopback addresses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ContextDialer opens connections. *net.Dialer implements it.
type ContextDialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// PolicyDialer dials only addresses the egress policy allows, deciding on the addresses it
// resolves itself right before connecting, so a name cannot be re-bound to a forbidden address
// between the check and the connection.
type PolicyDialer struct {
	Rules    *Rules
	Resolver Resolver      // nil: net.DefaultResolver
	Dialer   ContextDialer // connects to the checked "ip:port"; nil: a net.Dialer
	// Check, when set, is asked about each address after Rules allowed it; an error refuses that
	// address.
	Check func(host string, ip netip.Addr) error
}

// DialContext resolves the host of address ("host:port"), checks every address with Rules (and
// Check), and connects to the allowed ones in order until one answers. When no address is allowed
// it returns the refusal (a *PolicyError, or Check's error) without opening any connection.
// Only the tcp, tcp4 and tcp6 networks are supported.
func (d *PolicyDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ipNet := map[string]string{"tcp": "ip", "tcp4": "ip4", "tcp6": "ip6"}[network]
	if ipNet == "" {
		return nil, fmt.Errorf("dial %s %s: unsupported network", network, address)
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", address, err)
	}
	host = normalizeHost(host)
	if err := d.Rules.CheckName(host); err != nil {
		return nil, fmt.Errorf("dial %s: %w", address, err)
	}
	var ips []netip.Addr
	if ip, ok := parseIPLiteral(host); ok {
		ips = []netip.Addr{ip}
	} else {
		res := d.Resolver
		if res == nil {
			res = net.DefaultResolver
		}
		if ips, err = res.LookupNetIP(ctx, ipNet, host); err != nil {
			return nil, fmt.Errorf("dial %s: resolve: %w", address, err)
		}
	}
	var refusal, dialErr error
	for _, ip := range ips {
		ip = ip.WithZone("").Unmap()
		if err := d.Rules.CheckIP(host, ip); err != nil {
			refusal = cmpOr(refusal, err)
			continue
		}
		if d.Check != nil {
			if err := d.Check(host, ip); err != nil {
				refusal = cmpOr(refusal, err)
				continue
			}
		}
		inner := d.Dialer
		if inner == nil {
			inner = &net.Dialer{}
		}
		conn, err := inner.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
		if err == nil {
			return conn, nil
		}
		dialErr = errors.Join(dialErr, err)
		if ctx.Err() != nil {
			break
		}
	}
	switch {
	case dialErr != nil:
		return nil, fmt.Errorf("dial %s: %w", address, dialErr)
	case refusal != nil:
		return nil, fmt.Errorf("dial %s: %w", address, refusal)
	}
	return nil, fmt.Errorf("dial %s: no address found", address)
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
