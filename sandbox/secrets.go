package sandbox

import (
	"context"
	"fmt"
	"os"
	"sort"

	"github.com/agents-sandbox/agents-sandbox/proxy"
)

// LayerState marks configuration set through the secret_proxy tool and kept
// in the checkout's state.
const LayerState = "state"

// SecretInfo describes a secret without its value.
type SecretInfo struct {
	Name    string   `json:"name"`
	From    string   `json:"from"` // the reference: env:NAME, file:PATH or command:CMD
	Hosts   []string `json:"hosts"`
	Body    bool     `json:"body,omitempty"`
	AnyHost bool     `json:"allow_any_host_dangerous,omitempty"`
	// Layer says where it is configured: user, repo, project or state.
	Layer string `json:"layer"`
}

// ProxyStatus describes a project's egress proxy.
type ProxyStatus struct {
	Mode      NetworkMode  `json:"mode"`
	Container string       `json:"container"`
	State     VMState      `json:"state"`
	Network   string       `json:"network"`
	Allow     []string     `json:"allow"`
	Deny      []string     `json:"deny"`
	Secrets   []SecretInfo `json:"secrets"`
}

// applyStateSecrets lays secrets set through the tools over the config.
func applyStateSecrets(p *Project, st *State) {
	if len(st.Secrets) == 0 {
		return
	}
	if p.Config.Secrets == nil {
		p.Config.Secrets = map[string]SecretConfig{}
	}
	for n, s := range st.Secrets {
		p.Config.Secrets[n] = s
		if p.Origins != nil {
			p.Origins["secrets."+n] = LayerState
		}
	}
}

// Secrets lists the project's secrets: names, references and hosts.
func (m *Manager) Secrets(p *Project) []SecretInfo {
	out := []SecretInfo{}
	for n, s := range p.Config.Secrets {
		layer := p.Origins["secrets."+n]
		if layer == "" {
			layer = p.Origins["secrets."+n+".from"]
		}
		hosts := s.Hosts
		if hosts == nil {
			hosts = []string{}
		}
		out = append(out, SecretInfo{Name: n, From: s.From, Hosts: hosts, Body: s.Body, AnyHost: s.AllowAnyHostDangerous, Layer: layer})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ProxyStatus reports the project's egress mode, proxy container and secrets.
func (m *Manager) ProxyStatus(ctx context.Context, p *Project) (ProxyStatus, error) {
	name, netName := proxyNames(p)
	ps := ProxyStatus{Mode: p.Config.Network.Mode, Container: name, State: VMMissing, Network: netName,
		Allow: nonNil(p.Config.Network.Allow), Deny: nonNil(p.Config.Network.Deny), Secrets: m.Secrets(p)}
	vm, err := m.RT.InspectVM(ctx, name)
	if err == nil {
		ps.State = vm.State
	} else if !isNotFound(err) {
		return ps, err
	}
	return ps, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// SetSecret records a secret by reference in the checkout's state, after
// checking that its value can be read now (the value itself is not kept).
// It takes effect when the VM is next created or started (the changed
// secret set recreates it). Errors wrap ErrInvalid.
func (m *Manager) SetSecret(ctx context.Context, p *Project, name string, s SecretConfig) error {
	probe := Config{Agent: "x", Network: NetworkConfig{Mode: NetworkProxy}, Secrets: map[string]SecretConfig{name: s}}
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("set secret %s: %w: %w", name, ErrInvalid, err)
	}
	if _, err := proxy.ResolveSecretValueEnv(ctx, s.From, p.ID.ProjectDir, m.environ()); err != nil {
		return fmt.Errorf("set secret %s: %w: %w", name, ErrInvalid, err)
	}
	lock, err := m.lockVM(ctx, p)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return err
	}
	if st.Secrets == nil {
		st.Secrets = map[string]SecretConfig{}
	}
	st.Secrets[name] = s
	if err := SaveState(p.Names.StateDir, st); err != nil {
		return err
	}
	applyStateSecrets(p, st)
	return nil
}

// RemoveSecret forgets a secret set with SetSecret. A secret configured in
// a config file cannot be removed this way (ErrInvalid names the file layer).
func (m *Manager) RemoveSecret(ctx context.Context, p *Project, name string) error {
	lock, err := m.lockVM(ctx, p)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return err
	}
	if _, ok := st.Secrets[name]; !ok {
		if _, inConfig := p.Config.Secrets[name]; inConfig {
			layer := p.Origins["secrets."+name+".from"]
			return fmt.Errorf("remove secret %s: %w: it is set in the %s configuration file; remove it there", name, ErrInvalid, layer)
		}
		return fmt.Errorf("remove secret %s: %w", name, ErrNotFound)
	}
	delete(st.Secrets, name)
	if err := SaveState(p.Names.StateDir, st); err != nil {
		return err
	}
	delete(p.Config.Secrets, name)
	return nil
}

// environ is the environment secret sources read: Manager.Environ, or the
// process's when that is nil.
func (m *Manager) environ() []string {
	if m.Environ != nil {
		return m.Environ
	}
	return os.Environ()
}
