package tools

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// SecretProxyInput is the input of secret_proxy.
type SecretProxyInput struct {
	Target
	// Action is status, list, set, remove or audit.
	Action string `json:"action"`
	// Name is the secret's name (set, remove): the VM sees a placeholder in
	// the environment variable of that name.
	Name string `json:"name,omitempty"`
	// From is where the host reads the value (set): env:NAME or file:PATH.
	From string `json:"from,omitempty"`
	// Hosts may receive the value (set): host, .suffix or CIDR.
	Hosts []string `json:"hosts,omitempty"`
	// Body also substitutes the placeholder in request bodies (set).
	Body bool `json:"body,omitempty"`
	// Limit is how many audit events to return (audit; default 50).
	Limit int `json:"limit,omitempty"`
}

// SecretInfo is one configured secret: never its value.
type SecretInfo struct {
	Name string `json:"name"`
	// From is the value's reference (env:NAME, file:PATH); a command
	// reference shows only "command".
	From  string   `json:"from"`
	Hosts []string `json:"hosts"`
	Body  bool     `json:"body"`
	// AnyHost is allow_any_host_dangerous.
	AnyHost bool `json:"any_host"`
	// Layer is where it is configured: user, repo, project or state (set
	// with this tool).
	Layer string `json:"layer"`
}

// ProxyInfo is the project's proxy container.
type ProxyInfo struct {
	Container string `json:"container"`
	State     string `json:"state"`
	Network   string `json:"network"`
}

// AuditEventOut is one audit event of the proxy.
type AuditEventOut struct {
	Time   string `json:"time"`
	VM     string `json:"vm,omitempty"`
	Secret string `json:"secret,omitempty"`
	Host   string `json:"host,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
}

// NetworkInfo is the project's egress policy.
type NetworkInfo struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

// SecretProxyOutput is the result of secret_proxy.
type SecretProxyOutput struct {
	Action  string          `json:"action"`
	Network NetworkInfo     `json:"network"`
	Proxy   *ProxyInfo      `json:"proxy,omitempty"`
	VM      string          `json:"vm"`
	VMState string          `json:"vm_state"`
	Secrets []SecretInfo    `json:"secrets"`
	Audit   []AuditEventOut `json:"audit"`
	// Changed is true when set or remove changed the configuration; the VM
	// picks it up when it is next created or started (sandbox_create).
	Changed bool `json:"changed"`
}

func secretInfos(p *sandbox.Project) []SecretInfo {
	out := []SecretInfo{}
	for name, s := range p.Config.Secrets {
		from := s.From
		if strings.HasPrefix(from, "command:") {
			from = "command" // a command line may hold anything
		}
		layer := p.Origins["secrets."+name]
		if layer == "" {
			layer = p.Origins["secrets."+name+".from"]
		}
		out = append(out, SecretInfo{Name: name, From: from, Hosts: orEmpty(s.Hosts), Body: s.Body, AnyHost: s.AllowAnyHostDangerous, Layer: layer})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (h *handlers) secretProxyTool() Tool {
	return define(Tool{
		Name:  "secret_proxy",
		Title: "Manage the project's secrets and egress proxy",
		Description: "Inspect and manage the secrets the sandbox's egress proxy substitutes. The VM only ever sees placeholders; the proxy " +
			"swaps in the real value on the way to an allowed host. action \"status\": network mode, allow/deny lists, VM state and secrets; " +
			"\"list\": secret names, value references and allowed hosts (never values); \"set\": add or replace a secret by reference " +
			"(from: env:NAME or file:PATH, hosts: host, .suffix or CIDR); \"remove\": drop one; \"audit\": recent proxy audit events " +
			"(blocked placeholders and substitutions). Secret changes apply when the VM is next created (sandbox_create).",
		InputSchema: "secret_proxy.input.json", OutputSchema: "secret_proxy.output.json",
		Hints: Hints{ReadOnly: No, Destructive: Yes, Idempotent: Yes, OpenWorld: No},
	}, func(ctx context.Context, c Call, in *SecretProxyInput) (SecretProxyOutput, string, error) {
		const tool = "secret_proxy"
		switch in.Action {
		case "status", "list", "audit":
		case "set":
			if in.Name == "" {
				return SecretProxyOutput{}, "", InvalidParams(tool, "/name", "action set needs name, the secret's environment variable name")
			}
			if !validEnvName(in.Name) {
				return SecretProxyOutput{}, "", InvalidParams(tool, "/name", "name %q must be letters, digits and _ (it becomes an environment variable)", in.Name)
			}
			if kind, ref, _ := strings.Cut(in.From, ":"); kind != "env" && kind != "file" || ref == "" {
				return SecretProxyOutput{}, "", InvalidParams(tool, "/from", "action set needs from: env:NAME or file:PATH, where the host reads the value")
			}
			if len(in.Hosts) == 0 {
				return SecretProxyOutput{}, "", InvalidParams(tool, "/hosts", "action set needs hosts: the hosts that may receive the secret (host, .suffix or CIDR)")
			}
		case "remove":
			if in.Name == "" {
				return SecretProxyOutput{}, "", InvalidParams(tool, "/name", "action remove needs name")
			}
		default:
			return SecretProxyOutput{}, "", InvalidParams(tool, "/action", "action must be status, list, set, remove or audit, not %q", in.Action)
		}
		mutate := in.Action == "set" || in.Action == "remove"
		p, err := h.openWith(ctx, tool, in.Target, !mutate, false)
		if err != nil {
			return SecretProxyOutput{}, "", err
		}
		out := SecretProxyOutput{Action: in.Action, Audit: []AuditEventOut{}}
		if mutate && h.Secrets == nil || in.Action == "audit" && h.Audit == nil {
			return out, "", &Error{Code: CodeUnsupported, Kind: KindUnsupported, Tool: tool,
				Message: fmt.Sprintf("secret_proxy action %q is not available in this build of agents-sandbox; edit [secrets] in .agents-sandbox/config.toml instead", in.Action)}
		}
		switch in.Action {
		case "set":
			if err := h.Secrets.SetSecret(ctx, p, in.Name, sandbox.SecretConfig{From: in.From, Hosts: in.Hosts, Body: in.Body}); err != nil {
				return out, "", err
			}
			out.Changed = true
		case "remove":
			if err := h.Secrets.RemoveSecret(ctx, p, in.Name); err != nil {
				return out, "", err
			}
			out.Changed = true
		case "audit":
			n := in.Limit
			if n <= 0 {
				n = 50
			}
			evs, err := h.Audit.AuditEvents(ctx, p, n)
			if err != nil {
				return out, "", err
			}
			for _, e := range evs {
				out.Audit = append(out.Audit, AuditEventOut{Time: ts(e.Time), VM: e.VM, Secret: e.Secret, Host: e.Host, Method: e.Method, Path: e.Path, Action: string(e.Action), Reason: e.Reason})
			}
		}
		if out.Changed {
			// Re-read the configuration the change wrote.
			if p, err = h.openWith(ctx, tool, in.Target, true, false); err != nil {
				return out, "", err
			}
		}
		cfg := p.Config
		out.Network = NetworkInfo{Mode: string(cfg.Network.Mode), Allow: orEmpty(cfg.Network.Allow), Deny: orEmpty(cfg.Network.Deny)}
		out.Secrets = secretInfos(p)
		if h.Proxy != nil && in.Action == "status" {
			ps, err := h.Proxy.ProxyStatus(ctx, p)
			if err != nil {
				return out, "", err
			}
			out.Proxy = &ProxyInfo{Container: ps.Container, State: string(ps.State), Network: ps.Network}
		}
		st, err := h.Core.Status(ctx, p)
		if err != nil {
			return out, "", err
		}
		out.VM, out.VMState = st.VM, string(st.State)
		var text string
		switch in.Action {
		case "set":
			text = fmt.Sprintf("secret %s set (from %s, hosts %s); run sandbox_create to apply it to the VM", in.Name, in.From, strings.Join(in.Hosts, ", "))
		case "remove":
			text = fmt.Sprintf("secret %s removed; run sandbox_create to apply it to the VM", in.Name)
		case "audit":
			text = plural(len(out.Audit), "audit event", "audit events")
		default:
			names := make([]string, len(out.Secrets))
			for i, s := range out.Secrets {
				names[i] = s.Name
			}
			text = fmt.Sprintf("network mode %s; VM %s is %s; %s", out.Network.Mode, out.VM, out.VMState, plural(len(out.Secrets), "secret", "secrets"))
			if out.Proxy != nil {
				text = fmt.Sprintf("network mode %s; proxy %s is %s; VM %s is %s; %s", out.Network.Mode, out.Proxy.Container, out.Proxy.State, out.VM, out.VMState, plural(len(out.Secrets), "secret", "secrets"))
			}
			if len(names) > 0 {
				text += ": " + strings.Join(names, ", ")
			}
		}
		return out, text, nil
	})
}
