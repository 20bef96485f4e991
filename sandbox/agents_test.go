package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

func TestBuiltinAgents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		needsNode bool
		install   string
		daemon    bool
		attach    []string
		headless  []string
		config    string
		snippets  []string
		format    string
	}{
		{"opencode", true, "npm install -g opencode-ai", true,
			[]string{"opencode", "attach", "http://127.0.0.1:4096"}, []string{"opencode", "run", "--attach", "http://127.0.0.1:4096"},
			".config/opencode/opencode.jsonc", []string{"*.json", "*.jsonc"}, "jsonc"},
		{"claude-code", true, "npm install -g @anthropic-ai/claude-code", false,
			[]string{"claude"}, []string{"claude", "-p"}, ".claude/settings.json", []string{"*.json", "*.jsonc"}, "json"},
		{"codex", true, "npm install -g @openai/codex", false,
			[]string{"codex"}, []string{"codex", "exec"}, ".codex/config.toml", []string{"*.toml"}, "toml"},
		{"shell", false, "", false, []string{"bash", "-l"}, []string{"bash", "-lc"}, "", nil, ""},
	}
	if got, want := len(sandbox.BuiltinAgents()), len(tests); got != want {
		t.Fatalf("BuiltinAgents has %d agents, the test knows %d", got, want)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := sandbox.ResolveAgent(tt.name, sandbox.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			if a.Name != tt.name || !a.Builtin {
				t.Errorf("Name %q Builtin %v", a.Name, a.Builtin)
			}
			if a.NeedsNode != tt.needsNode || a.Install != tt.install {
				t.Errorf("NeedsNode %v Install %q; want %v %q", a.NeedsNode, a.Install, tt.needsNode, tt.install)
			}
			if (len(a.Serve) > 0) != tt.daemon || (len(a.Health) > 0) != tt.daemon {
				t.Errorf("Serve %q Health %q; daemon wanted: %v", a.Serve, a.Health, tt.daemon)
			}
			if !reflect.DeepEqual(a.Attach, tt.attach) || !reflect.DeepEqual(a.Headless, tt.headless) {
				t.Errorf("Attach %q Headless %q; want %q %q", a.Attach, a.Headless, tt.attach, tt.headless)
			}
			if a.Config != tt.config || !reflect.DeepEqual(a.Snippets, tt.snippets) || a.ConfigFormat() != tt.format {
				t.Errorf("Config %q Snippets %q format %q; want %q %q %q", a.Config, a.Snippets, a.ConfigFormat(), tt.config, tt.snippets, tt.format)
			}
		})
	}
}

// The opencode daemon and its health check agree on the address, and the
// health check bypasses the VM's egress proxy.
func TestOpencodeDaemon(t *testing.T) {
	t.Parallel()
	a, err := sandbox.ResolveAgent("opencode", sandbox.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	serve := strings.Join(a.Serve, " ")
	if serve != "opencode serve --hostname 127.0.0.1 --port 4096" {
		t.Errorf("Serve = %q", serve)
	}
	health := strings.Join(a.Health, " ")
	for _, want := range []string{"curl", "--noproxy *", sandbox.OpencodeURL} {
		if !strings.Contains(health, want) {
			t.Errorf("Health %q lacks %q", health, want)
		}
	}
}

func TestBuiltinAgentsAreFresh(t *testing.T) {
	t.Parallel()
	m := sandbox.BuiltinAgents()
	m["opencode"].Attach[0] = "changed"
	delete(m, "shell")
	again := sandbox.BuiltinAgents()
	if again["opencode"].Attach[0] != "opencode" || len(again) != 4 {
		t.Fatalf("BuiltinAgents returned shared state: %+v", again)
	}
}

func TestResolveAgentOverlay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		agent string
		user  sandbox.AgentProfile
		check func(t *testing.T, a sandbox.Agent)
	}{
		{"install replaced, rest kept", "claude-code", sandbox.AgentProfile{Install: "npm install -g @anthropic-ai/claude-code@1.0.0"},
			func(t *testing.T, a sandbox.Agent) {
				if a.Install != "npm install -g @anthropic-ai/claude-code@1.0.0" || !a.NeedsNode || a.Config != ".claude/settings.json" || a.Headless[0] != "claude" {
					t.Errorf("%+v", a)
				}
			}},
		{"list replaced whole", "opencode", sandbox.AgentProfile{Attach: []string{"opencode", "attach", "http://127.0.0.1:4096", "--model", "x"}},
			func(t *testing.T, a sandbox.Agent) {
				if len(a.Attach) != 5 || a.Serve[0] != "opencode" {
					t.Errorf("%+v", a)
				}
			}},
		{"empty lists clear the daemon", "opencode", sandbox.AgentProfile{Serve: []string{}, Health: []string{}},
			func(t *testing.T, a sandbox.Agent) {
				if len(a.Serve) != 0 || len(a.Health) != 0 || a.Attach[0] != "opencode" {
					t.Errorf("%+v", a)
				}
			}},
		{"empty serve drops the health check", "opencode", sandbox.AgentProfile{Serve: []string{}},
			func(t *testing.T, a sandbox.Agent) {
				if len(a.Serve) != 0 || len(a.Health) != 0 {
					t.Errorf("%+v", a)
				}
			}},
		{"needs_node turned on", "shell", sandbox.AgentProfile{NeedsNode: true},
			func(t *testing.T, a sandbox.Agent) {
				if !a.NeedsNode || a.Attach[0] != "bash" {
					t.Errorf("%+v", a)
				}
			}},
		{"config in another format takes its own snippets", "claude-code", sandbox.AgentProfile{Config: ".claude/other.toml"},
			func(t *testing.T, a sandbox.Agent) {
				if !reflect.DeepEqual(a.Snippets, []string{"*.toml"}) || a.ConfigFormat() != "toml" {
					t.Errorf("%+v", a)
				}
			}},
		{"user-defined agent", "test-agent", sandbox.AgentProfile{Attach: []string{"sh"}, Headless: []string{"sh", "-c"}, Config: ".test/config.json"},
			func(t *testing.T, a sandbox.Agent) {
				if a.Builtin || a.Name != "test-agent" || a.NeedsNode || a.Install != "" || !reflect.DeepEqual(a.Snippets, []string{"*.json", "*.jsonc"}) {
					t.Errorf("%+v", a)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := sandbox.DefaultConfig()
			cfg.Agents = map[string]sandbox.AgentProfile{tt.agent: tt.user}
			a, err := sandbox.ResolveAgent(tt.agent, cfg)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, a)
			// The built-in table is untouched.
			if b := sandbox.BuiltinAgents()["opencode"]; len(b.Attach) != 3 || len(b.Serve) == 0 {
				t.Errorf("built-in opencode changed: %+v", b)
			}
		})
	}
}

func TestResolveAgentErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		agent string
		user  *sandbox.AgentProfile
		want  []string
	}{
		{"unknown", "nope", nil, []string{`"nope"`, "unknown agent", "claude-code, codex, mine, opencode, shell"}},
		{"empty name", "", nil, []string{"unknown agent"}},
		{"bad name", "My Agent", &sandbox.AgentProfile{Attach: []string{"x"}}, []string{"lower-case"}},
		{"serve without health", "d", &sandbox.AgentProfile{Serve: []string{"srv"}}, []string{"agents.d.health", "required"}},
		{"health without serve", "d", &sandbox.AgentProfile{Health: []string{"true"}}, []string{"agents.d.serve"}},
		{"absolute config", "c", &sandbox.AgentProfile{Config: "/etc/x.json"}, []string{"agents.c.config", "relative to /home/dev"}},
		{"escaping config", "c", &sandbox.AgentProfile{Config: "../x.json"}, []string{"agents.c.config", ".."}},
		{"yaml config", "c", &sandbox.AgentProfile{Config: ".c/config.yaml"}, []string{".json, .jsonc or .toml"}},
		{"snippets without config", "c", &sandbox.AgentProfile{Snippets: []string{"*.json"}}, []string{"agents.c.snippets", "needs config"}},
		{"snippet with a slash", "c", &sandbox.AgentProfile{Config: "c.json", Snippets: []string{"a/*.json"}}, []string{"without '/'"}},
		{"malformed snippet", "c", &sandbox.AgentProfile{Config: "c.json", Snippets: []string{"[a-"}}, []string{"agents.c.snippets"}},
		{"empty program", "c", &sandbox.AgentProfile{Attach: []string{""}}, []string{"agents.c.attach"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := sandbox.DefaultConfig()
			cfg.Agents = map[string]sandbox.AgentProfile{"mine": {Attach: []string{"x"}}}
			if tt.user != nil {
				cfg.Agents[tt.agent] = *tt.user
			}
			_, err := sandbox.ResolveAgent(tt.agent, cfg)
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// A user's [agents.NAME] table, read through LoadConfig, overlays the
// built-in profile; `serve = []` reaches ResolveAgent as an explicit clear.
func TestResolveAgentFromConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "config.toml")
	data := `agent = "opencode"
[agents.opencode]
serve = []
health = []
attach = ["opencode"]

[agents.tester]
attach = ["sh", "-c", "echo hi"]
headless = ["sh", "-c"]
`
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	lc, err := sandbox.LoadConfig(sandbox.ConfigSources{ProjectFile: file})
	if err != nil {
		t.Fatal(err)
	}
	a, err := sandbox.ResolveAgent("opencode", lc.Config)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Serve) != 0 || len(a.Health) != 0 || !reflect.DeepEqual(a.Attach, []string{"opencode"}) || a.Install != "npm install -g opencode-ai" {
		t.Errorf("opencode = %+v", a)
	}
	tester, err := sandbox.ResolveAgent("tester", lc.Config)
	if err != nil {
		t.Fatal(err)
	}
	if tester.Builtin || !reflect.DeepEqual(tester.Headless, []string{"sh", "-c"}) {
		t.Errorf("tester = %+v", tester)
	}
}
