package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// writeFile writes content to dir/rel (parents created) and returns the path.
func writeFile(t *testing.T, dir, rel, content string) string {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, src sandbox.ConfigSources) sandbox.LoadedConfig {
	t.Helper()
	lc, err := sandbox.LoadConfig(src)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	return lc
}

func TestLoadConfigDefaults(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	lc := load(t, sandbox.ConfigSources{
		UserFile:    filepath.Join(dir, "missing-user.toml"),
		ProjectFile: filepath.Join(dir, "missing-project.toml"),
	})
	if !reflect.DeepEqual(lc.Config, sandbox.DefaultConfig()) {
		t.Errorf("Config = %+v, want the defaults %+v", lc.Config, sandbox.DefaultConfig())
	}
	if len(lc.Files) != 0 {
		t.Errorf("Files = %v, want none", lc.Files)
	}
	for _, k := range []string{"agent", "runtime", "idle_timeout", "image.base", "resources.pids", "network.mode"} {
		if lc.Origins[k] != sandbox.LayerDefault {
			t.Errorf("origin of %s = %q, want default", k, lc.Origins[k])
		}
	}
}

// TestLoadConfigPrecedence sets keys across all six layers and checks every
// merged value and the layer each came from.
func TestLoadConfigPrecedence(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	user := writeFile(t, dir, "cfg/agents-sandbox/config.toml", `
agent = "from-user"
runtime = "docker"
idle_timeout = "10m"
[image]
base = "user/base:1"
ca_certificates = ["/etc/user-ca.pem"]
[resources]
memory = "1g"
[network]
allow = ["a.example", "b.example"]
[env]
A = "user-a"
B = "user-b"
[secrets.GH_TOKEN]
from = "env:GH_TOKEN"
hosts = ["github.com"]
[home]
".gitconfig" = ""
[[mounts]]
source = "/srv/one"
target = "/mnt/one"
[[mounts]]
source = "/srv/two"
target = "/mnt/two"
[agents.mine]
install = "echo user"
attach = ["mine"]
`)
	repo := writeFile(t, dir, "cfg/agents-sandbox/repo-0123/config.toml", `
agent = "from-repo"
idle_timeout = "45m"
[image]
base = "repo/base:2"
[env]
B = "repo-b"
`)
	project := writeFile(t, dir, "proj/.agents-sandbox/config.toml", `
agent = "from-project"
oci_runtime = "runsc"
[resources]
cpus = 1.5
memory = "2g"
[network]
mode = "open"
allow = ["c.example"]
[env]
C = "project-c"
[secrets.GH_TOKEN]
hosts = ["api.github.com", ".githubusercontent.com"]
[[mounts]]
source = "/srv/three"
target = "/mnt/three"
read_only = true
[agents.mine]
attach = ["mine", "--project"]
`)
	lc := load(t, sandbox.ConfigSources{
		UserFile:    user,
		RepoFile:    repo,
		ProjectFile: project,
		Environ: []string{
			"PATH=/usr/bin", "AGENTS_SANDBOX_AGENT=from-env", "AGENTS_SANDBOX_RESOURCES_CPUS=3",
			"AGENTS_SANDBOX_NETWORK_DENY=10.0.0.0/8, .internal", "AGENTS_SANDBOX_LOG_LEVEL=debug",
		},
		Flags: map[string]string{"agent": "from-flag", "network.mode": "none"},
	})
	c := lc.Config
	want := sandbox.Config{
		Agent:       "from-flag",
		Runtime:     "docker",
		OCIRuntime:  "runsc",
		IdleTimeout: sandbox.Duration{Duration: 45 * time.Minute},
		Image:       sandbox.ImageConfig{Base: "repo/base:2", CACertificates: []string{"/etc/user-ca.pem"}},
		Resources:   sandbox.Resources{CPUs: 3, Memory: "2g", Pids: 4096},
		Network:     sandbox.NetworkConfig{Mode: sandbox.NetworkNone, Allow: []string{"c.example"}, Deny: []string{"10.0.0.0/8", ".internal"}},
		Env:         map[string]string{"A": "user-a", "B": "repo-b", "C": "project-c"},
		Secrets: map[string]sandbox.SecretConfig{"GH_TOKEN": {
			From: "env:GH_TOKEN", Hosts: []string{"api.github.com", ".githubusercontent.com"},
		}},
		Home: map[string]sandbox.HomeMapping{".gitconfig": {}},
		Mounts: []sandbox.Mount{
			{Source: "/srv/three", Target: "/mnt/three", ReadOnly: true},
		},
		Agents: map[string]sandbox.AgentProfile{"mine": {Install: "echo user", Attach: []string{"mine", "--project"}}},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("merged config:\n got %+v\nwant %+v", c, want)
	}
	wantOrigins := map[string]string{
		"agent":                  sandbox.LayerFlag,
		"runtime":                sandbox.LayerUser,
		"oci_runtime":            sandbox.LayerProject,
		"idle_timeout":           sandbox.LayerRepo,
		"image.base":             sandbox.LayerRepo,
		"image.ca_certificates":  sandbox.LayerUser,
		"resources.cpus":         sandbox.LayerEnv,
		"resources.memory":       sandbox.LayerProject,
		"resources.pids":         sandbox.LayerDefault,
		"network.mode":           sandbox.LayerFlag,
		"network.allow":          sandbox.LayerProject,
		"network.deny":           sandbox.LayerEnv,
		"env.A":                  sandbox.LayerUser,
		"env.B":                  sandbox.LayerRepo,
		"env.C":                  sandbox.LayerProject,
		"secrets.GH_TOKEN.from":  sandbox.LayerUser,
		"secrets.GH_TOKEN.hosts": sandbox.LayerProject,
		`home.".gitconfig"`:      sandbox.LayerUser,
		"mounts":                 sandbox.LayerProject,
		"agents.mine.install":    sandbox.LayerUser,
		"agents.mine.attach":     sandbox.LayerProject,
	}
	if !reflect.DeepEqual(lc.Origins, wantOrigins) {
		t.Errorf("Origins:\n got %v\nwant %v", lc.Origins, wantOrigins)
	}
	if want := []string{user, repo, project}; !reflect.DeepEqual(lc.Files, want) {
		t.Errorf("Files = %v, want %v", lc.Files, want)
	}
}

// TestLoadConfigReplaceKinds: a table over a scalar and a scalar over a table
// replace whole values, and origins follow.
func TestLoadConfigReplaceKinds(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	user := writeFile(t, dir, "user.toml", `
[home]
".config/gh" = "gh-user"
".ssh" = { source = "/keys", optional = true }
`)
	project := writeFile(t, dir, "proj/config.toml", `
[home.".config/gh"]
optional = true
[home]
".ssh" = "/other-keys"
`)
	lc := load(t, sandbox.ConfigSources{UserFile: user, ProjectFile: project})
	want := map[string]sandbox.HomeMapping{
		".config/gh": {Optional: true},
		".ssh":       {Source: "/other-keys"},
	}
	if !reflect.DeepEqual(lc.Config.Home, want) {
		t.Errorf("Home = %+v, want %+v", lc.Config.Home, want)
	}
	for k, v := range map[string]string{
		`home.".config/gh".optional`: sandbox.LayerProject,
		`home.".ssh"`:                sandbox.LayerProject,
	} {
		if lc.Origins[k] != v {
			t.Errorf("origin of %s = %q, want %q (all: %v)", k, lc.Origins[k], v, lc.Origins)
		}
	}
	for _, gone := range []string{`home.".config/gh"`, `home.".ssh".source`, `home.".ssh".optional`} {
		if l, ok := lc.Origins[gone]; ok {
			t.Errorf("origin of replaced %s still recorded (%s)", gone, l)
		}
	}
}

// TestLoadConfigFileErrors: every rejected file names the file, and the key
// or the line and column.
func TestLoadConfigFileErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, content string
		key           string // want ConfigError.Key
		line, col     int    // want position (0 = not checked)
		msg           string // substring of Error()
	}{
		{name: "unknown top-level key", content: "agnet = \"x\"\n", key: "agnet", msg: "unknown key"},
		{name: "unknown nested key", content: "[resources]\ncpu = 2\n", key: "resources.cpu", msg: "unknown key"},
		{name: "unknown keys listed", content: "zzz = 1\n[network]\nmodes = \"open\"\n", msg: "also unknown"},
		{name: "unknown key in a secret", content: "[secrets.GH]\nfrom = \"env:X\"\nhosts = [\"a\"]\nhots = 1\n", key: "secrets.GH.hots", msg: "unknown key"},
		{name: "unknown key in a mount", content: "[[mounts]]\nsource = \"/a\"\ntarget = \"/b\"\nreadonly = true\n", key: "mounts.readonly", msg: "unknown key"},
		{name: "unknown key in a home table", content: "[home.\".x\"]\nsrc = \"a\"\n", key: `home.".x"`, msg: `unknown key "src"`},
		{name: "unknown table", content: "[imag]\nbase = \"x\"\n", key: "imag", msg: "unknown key"},
		{name: "syntax: unterminated string", content: "agent = \"x\n", line: 1, col: 11, msg: ":1:11:"},
		{name: "syntax: bad line 3", content: "agent = \"x\"\n\nruntime docker\n", line: 3, col: 9, msg: ":3:9:"},
		{name: "syntax: duplicate key", content: "agent = \"a\"\nagent = \"b\"\n", line: 2, msg: ":2:"},
		{name: "wrong type: string", content: "agent = 1\n", key: "agent", line: 1, msg: "incompatible types"},
		{name: "wrong type: float", content: "[resources]\ncpus = \"two\"\n", key: "resources.cpus", msg: "incompatible types"},
		{name: "wrong type: table", content: "network = \"open\"\n", key: "network", msg: "expected table but found string"},
		{name: "wrong type: list", content: "[network]\nallow = \"a.example\"\n", key: "network.allow", msg: "incompatible types"},
		{name: "wrong type: env value", content: "[env]\nFOO = 1\n", key: "env.FOO", msg: "incompatible types"},
		{name: "duration: bare number", content: "idle_timeout = 30\n", key: "idle_timeout", line: 1, msg: `must be a duration string such as "30m"`},
		{name: "duration: no unit", content: "idle_timeout = \"30\"\n", key: "idle_timeout", msg: "with a unit"},
		{name: "duration: negative", content: "idle_timeout = \"-5m\"\n", key: "idle_timeout", msg: "negative"},
		{name: "duration: float", content: "idle_timeout = 1.5\n", key: "idle_timeout", msg: "duration string"},
		{name: "case: Agent", content: "Agent = \"x\"\n", key: "Agent", msg: "lower-case"},
		{name: "case: table", content: "[Resources]\ncpus = 1\n", key: "Resources", msg: "lower-case"},
		{name: "case: nested", content: "[network]\nMode = \"open\"\n", key: "network.Mode", msg: "lower-case"},
		{name: "case: agent field", content: "[agents.x]\nInstall = \"y\"\n", key: "agents.x.Install", msg: "lower-case"},
		{name: "home: wrong type", content: "[home]\n\".x\" = 1\n", key: `home.".x"`, msg: "source path string or a table"},
		{name: "home: bad hook", content: "[home.\".x\"]\nhook = \"shutdown\"\n", key: `home.".x"`, msg: `hook must be "startup"`},
		{name: "home: bad optional", content: "[home.\".x\"]\noptional = \"yes\"\n", key: `home.".x"`, msg: "true or false"},
		// Validate, attributed to the file that set the key.
		{name: "secret without hosts", content: "[secrets.GH]\nfrom = \"env:GH\"\n", key: "secrets.GH.hosts", msg: "allow_any_host_dangerous"},
		{name: "secret with empty hosts", content: "[secrets.GH]\nfrom = \"env:GH\"\nhosts = []\n", key: "secrets.GH.hosts", msg: "hosts that may receive it"},
		{name: "secret without from", content: "[secrets.GH]\nhosts = [\"a\"]\n", key: "secrets.GH.from", msg: "required"},
		{name: "secret bad from", content: "[secrets.GH]\nfrom = \"vault:x\"\nhosts = [\"a\"]\n", key: "secrets.GH.from", msg: "env:, file: or command:"},
		{name: "secret bad name", content: "[secrets.\"my-token\"]\nfrom = \"env:X\"\nhosts = [\"a\"]\n", key: "secrets.my-token", msg: "environment variable"},
		{name: "network mode", content: "[network]\nmode = \"bogus\"\n", key: "network.mode", msg: `"proxy", "open" or "none"`},
		{name: "network mode case", content: "[network]\nmode = \"Open\"\n", key: "network.mode", msg: `not "Open"`},
		{name: "memory", content: "[resources]\nmemory = \"lots\"\n", key: "resources.memory", msg: "not a size"},
		{name: "memory nan", content: "[resources]\nmemory = \"nan\"\n", key: "resources.memory", msg: "not a size"},
		{name: "negative cpus", content: "[resources]\ncpus = -1.0\n", key: "resources.cpus", msg: "negative"},
		{name: "negative pids", content: "[resources]\npids = -1\n", key: "resources.pids", msg: "negative"},
		{name: "empty agent", content: "agent = \"\"\n", key: "agent", msg: "must name an agent"},
		{name: "home target absolute", content: "[home]\n\"/etc/x\" = \"/x\"\n", key: `home."/etc/x"`, msg: "relative to /home/dev"},
		{name: "home target escapes", content: "[home]\n\"a/../../x\" = \"/x\"\n", key: `home."a/../../x"`, msg: `".."`},
		{name: "mount target relative", content: "[[mounts]]\nsource = \"/a\"\ntarget = \"b\"\n", key: "mounts[0].target", msg: "absolute"},
		{name: "mount without source", content: "[[mounts]]\ntarget = \"/b\"\n", key: "mounts[0].source", msg: "required"},
		{name: "env name with =", content: "[env]\n\"A=B\" = \"x\"\n", key: `env."A=B"`, msg: "environment variable name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, tempDir(t), ".agents-sandbox/config.toml", c.content)
			_, err := sandbox.LoadConfig(sandbox.ConfigSources{ProjectFile: path})
			var ce *sandbox.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v (%T), want a *ConfigError", err, err)
			}
			if ce.Source != path {
				t.Errorf("Source = %q, want the file %q", ce.Source, path)
			}
			if c.key != "" && ce.Key != c.key {
				t.Errorf("Key = %q, want %q", ce.Key, c.key)
			}
			if c.line != 0 && ce.Line != c.line {
				t.Errorf("Line = %d, want %d", ce.Line, c.line)
			}
			if c.col != 0 && ce.Column != c.col {
				t.Errorf("Column = %d, want %d", ce.Column, c.col)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, path) || !strings.Contains(msg, c.msg) {
				t.Errorf("Error() = %q, want it to start with the path and contain %q", msg, c.msg)
			}
			if c.key != "" && !strings.Contains(msg, c.key) && !strings.Contains(msg, strings.ReplaceAll(c.key, `"`, `\"`)) {
				t.Errorf("Error() = %q does not name the key %s", msg, c.key)
			}
		})
	}
}

// TestLoadConfigAttribution: a bad value is blamed on the layer that set it.
func TestLoadConfigAttribution(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	user := writeFile(t, dir, "user.toml", "[network]\nmode = \"bogus\"\n[secrets.GH]\nfrom = \"env:GH\"\n")
	repo := writeFile(t, dir, "repo.toml", "[secrets.GH]\nhosts = []\n")
	for _, c := range []struct {
		name    string
		src     sandbox.ConfigSources
		source  string
		wantKey string
	}{
		{"user file", sandbox.ConfigSources{UserFile: user}, user, "network.mode"},
		{"overridden by env", sandbox.ConfigSources{UserFile: user, RepoFile: repo, Environ: []string{"AGENTS_SANDBOX_NETWORK_MODE=Proxy"}}, "environment variable AGENTS_SANDBOX_NETWORK_MODE", "network.mode"},
		{"overridden by flag", sandbox.ConfigSources{UserFile: user, Flags: map[string]string{"network.mode": "x"}}, "flag for network.mode", "network.mode"},
		{"secret hosts from repo", sandbox.ConfigSources{UserFile: user, RepoFile: repo, Flags: map[string]string{"network.mode": "open"}}, repo, "secrets.GH.hosts"},
		{"defaults", sandbox.ConfigSources{Flags: map[string]string{"agent": ""}}, "flag for agent", "agent"},
	} {
		_, err := sandbox.LoadConfig(c.src)
		var ce *sandbox.ConfigError
		if !errors.As(err, &ce) || ce.Source != c.source || ce.Key != c.wantKey {
			t.Errorf("%s: err = %v, want a ConfigError from %q on %s", c.name, err, c.source, c.wantKey)
		}
	}
}

func TestLoadConfigUnreadable(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	// A directory where the file should be is an error naming it, not "missing".
	if err := os.MkdirAll(filepath.Join(dir, "config.toml"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := sandbox.LoadConfig(sandbox.ConfigSources{UserFile: filepath.Join(dir, "config.toml")})
	var ce *sandbox.ConfigError
	if !errors.As(err, &ce) || ce.Source != filepath.Join(dir, "config.toml") {
		t.Errorf("err = %v, want a ConfigError naming the path", err)
	}
}

func TestLoadConfigEnvironment(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	user := writeFile(t, dir, "user.toml", "[network]\nallow = [\"from-user\"]\n")
	cases := []struct {
		name    string
		env     []string
		check   func(sandbox.Config) bool
		errVar  string // want an error naming this variable
		errText string
	}{
		{name: "list", env: []string{"AGENTS_SANDBOX_NETWORK_ALLOW=a.example, .b.org,,10.0.0.0/8 "},
			check: func(c sandbox.Config) bool {
				return reflect.DeepEqual(c.Network.Allow, []string{"a.example", ".b.org", "10.0.0.0/8"})
			}},
		{name: "empty list replaces", env: []string{"AGENTS_SANDBOX_NETWORK_ALLOW="},
			check: func(c sandbox.Config) bool { return len(c.Network.Allow) == 0 }},
		{name: "ca list", env: []string{"AGENTS_SANDBOX_IMAGE_CA_CERTIFICATES=/a.pem,/b.pem"},
			check: func(c sandbox.Config) bool {
				return reflect.DeepEqual(c.Image.CACertificates, []string{"/a.pem", "/b.pem"})
			}},
		{name: "float", env: []string{"AGENTS_SANDBOX_RESOURCES_CPUS= 0.5"},
			check: func(c sandbox.Config) bool { return c.Resources.CPUs == 0.5 }},
		{name: "float from int", env: []string{"AGENTS_SANDBOX_RESOURCES_CPUS=2"},
			check: func(c sandbox.Config) bool { return c.Resources.CPUs == 2 }},
		{name: "int", env: []string{"AGENTS_SANDBOX_RESOURCES_PIDS=512"},
			check: func(c sandbox.Config) bool { return c.Resources.Pids == 512 }},
		{name: "duration", env: []string{"AGENTS_SANDBOX_IDLE_TIMEOUT=1h30m"},
			check: func(c sandbox.Config) bool { return c.IdleTimeout.Duration == 90*time.Minute }},
		{name: "duration zero", env: []string{"AGENTS_SANDBOX_IDLE_TIMEOUT=0"},
			check: func(c sandbox.Config) bool { return c.IdleTimeout.Duration == 0 }},
		{name: "strings", env: []string{"AGENTS_SANDBOX_AGENT=codex", "AGENTS_SANDBOX_OCI_RUNTIME=runsc", "AGENTS_SANDBOX_IMAGE_BASE=x:1", "AGENTS_SANDBOX_RESOURCES_MEMORY=512m", "AGENTS_SANDBOX_RUNTIME=docker", "AGENTS_SANDBOX_NETWORK_MODE=none"},
			check: func(c sandbox.Config) bool {
				return c.Agent == "codex" && c.OCIRuntime == "runsc" && c.Image.Base == "x:1" && c.Resources.Memory == "512m" && c.Network.Mode == sandbox.NetworkNone
			}},
		{name: "process settings and other variables ignored", env: []string{"AGENTS_SANDBOX_LOG_LEVEL=debug", "HOME=/root", "NOEQUALS", "AGENTS_SANDBOX="},
			check: func(c sandbox.Config) bool { return c.Agent == "opencode" }},
		{name: "bad float", env: []string{"AGENTS_SANDBOX_RESOURCES_CPUS=two"}, errVar: "AGENTS_SANDBOX_RESOURCES_CPUS", errText: "must be a number"},
		{name: "bad int", env: []string{"AGENTS_SANDBOX_RESOURCES_PIDS=1.5"}, errVar: "AGENTS_SANDBOX_RESOURCES_PIDS", errText: "whole number"},
		{name: "bad duration", env: []string{"AGENTS_SANDBOX_IDLE_TIMEOUT=30"}, errVar: "AGENTS_SANDBOX_IDLE_TIMEOUT", errText: "duration"},
		{name: "bad mode", env: []string{"AGENTS_SANDBOX_NETWORK_MODE=wide"}, errVar: "AGENTS_SANDBOX_NETWORK_MODE", errText: `not "wide"`},
		{name: "bad memory", env: []string{"AGENTS_SANDBOX_RESOURCES_MEMORY=huge"}, errVar: "AGENTS_SANDBOX_RESOURCES_MEMORY", errText: "not a size"},
		{name: "unknown variable", env: []string{"AGENTS_SANDBOX_CPUS=2"}, errVar: "AGENTS_SANDBOX_CPUS", errText: "AGENTS_SANDBOX_RESOURCES_CPUS"},
		{name: "lower-case variable is not ours", env: []string{"agents_sandbox_cpus=2"},
			check: func(c sandbox.Config) bool { return c.Resources.CPUs == 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lc, err := sandbox.LoadConfig(sandbox.ConfigSources{UserFile: user, Environ: c.env})
			if c.errVar != "" {
				var ce *sandbox.ConfigError
				if !errors.As(err, &ce) || !strings.Contains(ce.Source, c.errVar) || !strings.Contains(err.Error(), c.errText) {
					t.Fatalf("err = %v, want a ConfigError naming %s and saying %q", err, c.errVar, c.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(lc.Config) {
				t.Errorf("config = %+v", lc.Config)
			}
			for _, kv := range c.env {
				if name, _, _ := strings.Cut(kv, "="); name == "AGENTS_SANDBOX_NETWORK_ALLOW" && lc.Origins["network.allow"] != sandbox.LayerEnv {
					t.Errorf("origin of network.allow = %q, want env", lc.Origins["network.allow"])
				}
			}
		})
	}
}

func TestLoadConfigFlags(t *testing.T) {
	t.Parallel()
	lc := load(t, sandbox.ConfigSources{
		Environ: []string{"AGENTS_SANDBOX_RESOURCES_CPUS=1"},
		Flags:   map[string]string{"resources.cpus": "2.5", "network.allow": "x.example", "idle_timeout": "5m"},
	})
	c := lc.Config
	if c.Resources.CPUs != 2.5 || !reflect.DeepEqual(c.Network.Allow, []string{"x.example"}) || c.IdleTimeout.Duration != 5*time.Minute {
		t.Errorf("config = %+v", c)
	}
	if lc.Origins["resources.cpus"] != sandbox.LayerFlag {
		t.Errorf("origin of resources.cpus = %q", lc.Origins["resources.cpus"])
	}
	for _, flags := range []map[string]string{{"resources.cpu": "1"}, {"env.FOO": "x"}, {"resources.pids": "many"}} {
		var ce *sandbox.ConfigError
		if _, err := sandbox.LoadConfig(sandbox.ConfigSources{Flags: flags}); !errors.As(err, &ce) || !strings.Contains(ce.Source, "flag") {
			t.Errorf("flags %v: err = %v, want a ConfigError from a flag", flags, err)
		}
	}
	for k := range sandbox.ScalarKeys {
		if v := sandbox.EnvVarName(k); !strings.HasPrefix(v, "AGENTS_SANDBOX_") || strings.ContainsAny(v, ".-abcdefghijklmnopqrstuvwxyz") {
			t.Errorf("EnvVarName(%q) = %q", k, v)
		}
	}
}

// TestLoadConfigRelativePaths: home sources (string and table form), mount
// sources and CA certificates are relative to the file that declares them.
func TestLoadConfigRelativePaths(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	userDir := filepath.Join(dir, "xdg", "agents-sandbox")
	projDir := filepath.Join(dir, "proj", ".agents-sandbox")
	user := writeFile(t, dir, "xdg/agents-sandbox/config.toml", `
[image]
ca_certificates = ["certs/corp.pem", "/abs/ca.pem", "~/ca.pem"]
[home]
".gitconfig" = "files/gitconfig"
".config/gh" = { source = "gh", optional = true }
".tilde" = "~/x"
".same" = ""
".abs" = "/etc/abs"
`)
	project := writeFile(t, dir, "proj/.agents-sandbox/config.toml", `
[home.".npmrc"]
source = "../npmrc"
hook = "startup"
root = true
[home]
".bare" = "dotfiles/bare"
[[mounts]]
source = "data"
target = "/data"
[[mounts]]
source = "~/cache"
target = "/cache"
`)
	lc := load(t, sandbox.ConfigSources{UserFile: user, ProjectFile: project})
	wantHome := map[string]sandbox.HomeMapping{
		".gitconfig": {Source: filepath.Join(userDir, "files", "gitconfig")},
		".config/gh": {Source: filepath.Join(userDir, "gh"), Optional: true},
		".tilde":     {Source: "~/x"},
		".same":      {},
		".abs":       {Source: "/etc/abs"},
		".npmrc":     {Source: filepath.Join(dir, "proj", "npmrc"), Hook: "startup", Root: true},
		".bare":      {Source: filepath.Join(projDir, "dotfiles", "bare")},
	}
	if !reflect.DeepEqual(lc.Config.Home, wantHome) {
		t.Errorf("Home:\n got %+v\nwant %+v", lc.Config.Home, wantHome)
	}
	wantCA := []string{filepath.Join(userDir, "certs", "corp.pem"), "/abs/ca.pem", "~/ca.pem"}
	if !reflect.DeepEqual(lc.Config.Image.CACertificates, wantCA) {
		t.Errorf("CACertificates = %v, want %v", lc.Config.Image.CACertificates, wantCA)
	}
	wantMounts := []sandbox.Mount{{Source: filepath.Join(projDir, "data"), Target: "/data"}, {Source: "~/cache", Target: "/cache"}}
	if !reflect.DeepEqual(lc.Config.Mounts, wantMounts) {
		t.Errorf("Mounts = %+v, want %+v", lc.Config.Mounts, wantMounts)
	}
}

// TestLoadConfigInlineMounts: the inline array form resolves like [[mounts]].
func TestLoadConfigInlineMounts(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	p := writeFile(t, dir, "c/config.toml", "mounts = [{ source = \"d\", target = \"/d\", read_only = true }]\n")
	lc := load(t, sandbox.ConfigSources{ProjectFile: p})
	want := []sandbox.Mount{{Source: filepath.Join(dir, "c", "d"), Target: "/d", ReadOnly: true}}
	if !reflect.DeepEqual(lc.Config.Mounts, want) {
		t.Errorf("Mounts = %+v, want %+v", lc.Config.Mounts, want)
	}
}

func TestSecretAllowAnyHost(t *testing.T) {
	t.Parallel()
	p := writeFile(t, tempDir(t), "c.toml", "[secrets.ANY]\nfrom = \"command:pass show x\"\nallow_any_host_dangerous = true\nbody = true\n")
	lc := load(t, sandbox.ConfigSources{ProjectFile: p})
	if s := lc.Config.Secrets["ANY"]; !s.AllowAnyHostDangerous || !s.Body || s.From != "command:pass show x" || len(s.Hosts) != 0 {
		t.Errorf("secret = %+v", s)
	}
}

func TestValidateNetworkMode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode sandbox.NetworkMode
		ok   bool
	}{
		{sandbox.NetworkProxy, true}, {sandbox.NetworkOpen, true}, {sandbox.NetworkNone, true},
		{"", false}, {"PROXY", false}, {"host", false}, {" open", false},
	} {
		cfg := sandbox.DefaultConfig()
		cfg.Network.Mode = c.mode
		err := cfg.Validate()
		if (err == nil) != c.ok {
			t.Errorf("Validate with network.mode %q: err = %v, want ok = %v", c.mode, err, c.ok)
		}
		var ce *sandbox.ConfigError
		if err != nil && (!errors.As(err, &ce) || ce.Key != "network.mode") {
			t.Errorf("mode %q: err = %v, want a ConfigError on network.mode", c.mode, err)
		}
	}
}

func TestDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30m", 30 * time.Minute, true},
		{"1h30m", 90 * time.Minute, true},
		{" 90s ", 90 * time.Second, true},
		{"0", 0, true},
		{"0s", 0, true},
		{"30", 0, false},
		{"", 0, false},
		{"-1m", 0, false},
		{"-0s", 0, false},
		{"soon", 0, false},
	} {
		var d sandbox.Duration
		err := d.UnmarshalText([]byte(c.in))
		if (err == nil) != c.ok || (c.ok && d.Duration != c.want) {
			t.Errorf("Duration(%q) = %v, %v; want %v, ok %v", c.in, d.Duration, err, c.want, c.ok)
		}
	}
	b, err := sandbox.Duration{Duration: 30 * time.Minute}.MarshalText()
	if err != nil || string(b) != "30m0s" {
		t.Errorf("MarshalText = %q, %v", b, err)
	}
}

func TestParseBytes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1048576", 1 << 20, true},
		{"512m", 512 << 20, true},
		{"4g", 4 << 30, true},
		{"4G", 4 << 30, true},
		{"4gb", 4 << 30, true},
		{"1.5GiB", 3 << 29, true},
		{"100kb", 100 << 10, true},
		{"2t", 2 << 40, true},
		{".5g", 1 << 29, true},
		{" 10 m ", 10 << 20, true},
		{"7b", 7, true},
		{"0", 0, true},
		{"", 0, false},
		{"lots", 0, false},
		{"nan", 0, false},
		{"inf", 0, false},
		{"-1g", 0, false},
		{"1e3", 0, false},
		{"0x10", 0, false},
		{"4gg", 0, false},
		{"99999999999t", 0, false},
	} {
		got, err := sandbox.ParseBytes(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

// FuzzParseConfigLayer: parsing any input never panics, and anything the
// strict parser accepts merges over the defaults and decodes into a Config.
func FuzzParseConfigLayer(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "config", "*.toml"))
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "agent = \"x\"", "idle_timeout = 30", "[home]\n\".x\" = 1", "[[mounts]]\nsource=\"a\"\ntarget=\"/b\"",
		"mounts = [{source=\"a\", target=\"/b\"}]", "[env]\n\"\" = \"x\"", "[secrets.\"a.b\"]\nfrom=\"env:x\"",
		"[agents.\"\"]\nserve = []", "a.b.c = 1", "[home.\"x\"]\nsource = \"\"\n[home]\ny = \"\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := sandbox.ParseConfigLayer(data, "/fuzz/.agents-sandbox/config.toml")
		if err != nil {
			var ce *sandbox.ConfigError
			if !errors.As(err, &ce) || ce.Source != "/fuzz/.agents-sandbox/config.toml" {
				t.Fatalf("error %v (%T) is not a ConfigError naming the file", err, err)
			}
			return
		}
		cfg, err := sandbox.DecodeOverDefaults(m)
		if err != nil {
			t.Fatalf("accepted layer does not decode over the defaults: %v\ninput:\n%s", err, data)
		}
		_ = cfg.Validate() // must not panic
	})
}
