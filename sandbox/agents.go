package sandbox

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// Agent is a resolved agent: a built-in profile with the user's
// [agents.NAME] fields laid over it, or a profile the user defined.
type Agent struct {
	// Name is the agent's name ("opencode"); it names artifacts
	// (`<checkout-slug>-<agent>`), so it is lower-case [a-z0-9_.-].
	Name string `json:"name"`
	AgentProfile
	// Builtin is true when a built-in profile is the base (whether or not
	// the user overrode fields of it). The other config files an agent reads
	// next to Config are sandbox/provision's business (provision.Shadowed).
	Builtin bool `json:"builtin"`
}

// Built-in agent names.
const (
	AgentOpencode   = "opencode"
	AgentClaudeCode = "claude-code"
	AgentCodex      = "codex"
	AgentShell      = "shell"
)

// OpencodeURL is where the opencode daemon listens inside the VM.
const OpencodeURL = "http://127.0.0.1:4096"

// BuiltinAgents returns the built-in agent profiles by name: opencode,
// claude-code, codex and shell. Each call returns a fresh map.
func BuiltinAgents() map[string]AgentProfile {
	return map[string]AgentProfile{
		AgentOpencode: {
			Install:   "npm install -g opencode-ai",
			NeedsNode: true,
			Serve:     []string{"opencode", "serve", "--hostname", "127.0.0.1", "--port", "4096"},
			// Any HTTP answer means the daemon is up (a password-protected
			// server answers 401); --noproxy keeps the VM's egress proxy out of it.
			Health:   []string{"curl", "-sS", "-o", "/dev/null", "--noproxy", "*", "--max-time", "2", OpencodeURL + "/global/health"},
			Attach:   []string{"opencode", "attach", OpencodeURL},
			Headless: []string{"opencode", "run", "--attach", OpencodeURL},
			Config:   ".config/opencode/opencode.jsonc",
			Snippets: []string{"*.json", "*.jsonc"},
		},
		AgentClaudeCode: {
			Install:   "npm install -g @anthropic-ai/claude-code",
			NeedsNode: true,
			Attach:    []string{"claude"},
			Headless:  []string{"claude", "-p"},
			Config:    ".claude/settings.json",
			Snippets:  []string{"*.json", "*.jsonc"},
		},
		AgentCodex: {
			Install:   "npm install -g @openai/codex",
			NeedsNode: true,
			Attach:    []string{"codex"},
			Headless:  []string{"codex", "exec"},
			Config:    ".codex/config.toml",
			Snippets:  []string{"*.toml"},
		},
		AgentShell: {
			Attach:   []string{"bash", "-l"},
			Headless: []string{"bash", "-lc"},
		},
	}
}

// agentNameRe is what an agent name may be: it becomes part of Docker names
// and image tags.
var agentNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// maxAgentNameLen keeps `<agent>-latest` well inside Docker's 128-byte tag.
const maxAgentNameLen = 40

// ResolveAgent returns the agent called name: the built-in profile of that
// name with every field the user set under [agents.NAME] in cfg replacing the
// built-in one (lists replace lists; an explicitly empty list, `serve = []`,
// clears the field, and `serve = []` the health check too; NeedsNode can
// only be turned on), or the user's own profile when there is no built-in of
// that name.
//
// Errors wrap ErrInvalid: an unknown name (the message lists the known ones),
// a name that is not lower-case [a-z0-9_.-] of at most 40 bytes, a daemon
// (serve) without a health check, a config path that is absolute or leaves
// /home/dev, a config format other than .json, .jsonc or .toml, snippets
// without a config or malformed snippet patterns.
func ResolveAgent(name string, cfg Config) (Agent, error) {
	builtins := BuiltinAgents()
	base, isBuiltin := builtins[name]
	user, isUser := cfg.Agents[name]
	if !isBuiltin && !isUser {
		return Agent{}, fmt.Errorf("agent %q: %w: unknown agent; known agents: %s (define more under [agents.NAME])", name, ErrInvalid, strings.Join(knownAgents(builtins, cfg), ", "))
	}
	if !agentNameRe.MatchString(name) || len(name) > maxAgentNameLen {
		return Agent{}, fmt.Errorf("agent %q: %w: an agent name must be lower-case letters, digits, '_', '.' or '-', starting with a letter or digit, at most %d bytes", name, ErrInvalid, maxAgentNameLen)
	}
	a := Agent{Name: name, AgentProfile: base, Builtin: isBuiltin}
	if isUser {
		a.AgentProfile = overlayProfile(base, user)
	}
	if a.Config != "" && a.Snippets == nil {
		a.Snippets = defaultSnippets(a.Config)
	}
	if err := a.validate(); err != nil {
		return Agent{}, err
	}
	return a, nil
}

// knownAgents lists built-in and user-defined agent names, sorted.
func knownAgents(builtins map[string]AgentProfile, cfg Config) []string {
	var names []string
	for n := range builtins {
		names = append(names, n)
	}
	for n := range cfg.Agents {
		if _, dup := builtins[n]; !dup {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// overlayProfile lays the fields the user set over base. A nil list or an
// empty string is "not set"; a non-nil empty list is set (and clears).
func overlayProfile(base, user AgentProfile) AgentProfile {
	out := base
	if user.Install != "" {
		out.Install = user.Install
	}
	if user.NeedsNode {
		out.NeedsNode = true
	}
	for _, f := range []struct{ dst, src *[]string }{
		{&out.Serve, &user.Serve}, {&out.Health, &user.Health}, {&out.Attach, &user.Attach},
		{&out.Headless, &user.Headless}, {&out.Snippets, &user.Snippets},
	} {
		if *f.src != nil {
			*f.dst = append([]string{}, *f.src...)
		}
	}
	if user.Serve != nil && len(user.Serve) == 0 && user.Health == nil {
		// `serve = []` turns the daemon off, its health check with it.
		out.Health = nil
	}
	if user.Config != "" {
		out.Config = user.Config
		if user.Snippets == nil && path.Ext(user.Config) != path.Ext(base.Config) {
			// The built-in snippets are for another format.
			out.Snippets = nil
		}
	}
	// Lists are copied so that callers cannot alias the built-in tables.
	out.Serve = cloneList(out.Serve)
	out.Health = cloneList(out.Health)
	out.Attach = cloneList(out.Attach)
	out.Headless = cloneList(out.Headless)
	out.Snippets = cloneList(out.Snippets)
	return out
}

func cloneList(l []string) []string {
	if l == nil {
		return nil
	}
	return append([]string{}, l...)
}

// defaultSnippets are the snippet patterns for a config file's format.
func defaultSnippets(config string) []string {
	switch path.Ext(config) {
	case ".toml":
		return []string{"*.toml"}
	case ".json", ".jsonc":
		return []string{"*.json", "*.jsonc"}
	}
	return nil
}

// ConfigFormat is the format of the agent's config file: "json", "jsonc",
// "toml", or "" when it reads none.
func (a Agent) ConfigFormat() string {
	return strings.TrimPrefix(path.Ext(a.Config), ".")
}

func (a Agent) validate() error {
	key := "agents." + a.Name
	bad := func(field, msg string, args ...any) error {
		return fmt.Errorf("agent %q: %w: %s.%s %s", a.Name, ErrInvalid, key, field, fmt.Sprintf(msg, args...))
	}
	if len(a.Serve) > 0 && len(a.Health) == 0 {
		return bad("health", "is required when serve is set: a command that exits 0 once the daemon answers")
	}
	if len(a.Health) > 0 && len(a.Serve) == 0 {
		return bad("serve", "is required when health is set: the daemon command the health check is for")
	}
	if a.Config != "" {
		if err := checkHomeTarget(a.Config); err != nil {
			return bad("config", "%q: %v", a.Config, err)
		}
		switch a.ConfigFormat() {
		case "json", "jsonc", "toml":
		default:
			return bad("config", "%q: the config file must be .json, .jsonc or .toml (the formats provisioning merges)", a.Config)
		}
	}
	if len(a.Snippets) > 0 && a.Config == "" {
		return bad("snippets", "needs config: the file the snippets merge into")
	}
	for _, s := range a.Snippets {
		if s == "" || strings.Contains(s, "/") {
			return bad("snippets", "%q: a snippet pattern is a file name pattern like \"*.json\", without '/'", s)
		}
		if _, err := path.Match(s, "x"); err != nil {
			return bad("snippets", "%q: %v", s, err)
		}
	}
	for _, f := range []struct {
		name string
		cmd  []string
	}{{"serve", a.Serve}, {"health", a.Health}, {"attach", a.Attach}, {"headless", a.Headless}} {
		if len(f.cmd) > 0 && strings.TrimSpace(f.cmd[0]) == "" {
			return bad(f.name, "starts with an empty program name")
		}
	}
	return nil
}
