package sandbox

import (
	"context"
	"fmt"
)

// egress is how a VM reaches the network: the network it joins, the
// environment it gets (proxy variables, secret placeholders) and extra
// /etc/hosts entries.
type egress struct {
	Network string
	Env     map[string]string
	// SecretEnv holds placeholders and the proxy URL with its credential:
	// in the VM's environment but not in its fingerprint.
	SecretEnv  map[string]string
	ExtraHosts []string
	// Proxy is true when the VM's egress goes through the secret proxy.
	Proxy bool
}

// ensureEgress sets up the VM's network according to network.mode.
func (m *Manager) ensureEgress(ctx context.Context, p *Project, as *AgentState) (egress, error) {
	switch p.Config.Network.Mode {
	case NetworkNone:
		if len(p.Config.Secrets) > 0 {
			m.Log.Warn().Msg("network.mode is \"none\": secrets are configured but nothing can reach their hosts")
		}
		return egress{Network: "none"}, nil
	case NetworkOpen:
		if len(p.Config.Secrets) == 0 {
			return egress{}, nil
		}
		// Secrets still need the proxy to be substituted; the VM's network
		// is not internal, so it also has direct egress.
		return m.ensureProxy(ctx, p, as)
	case NetworkProxy:
		return m.ensureProxy(ctx, p, as)
	}
	return egress{}, fmt.Errorf("network.mode %q: %w", p.Config.Network.Mode, ErrInvalid)
}
