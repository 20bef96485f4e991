package provision_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/provision"
)

// hostFixture is a host home and a directory outside it.
type hostFixture struct {
	home, outside, layer string
}

func newHost(t *testing.T) hostFixture {
	t.Helper()
	dir := t.TempDir()
	h := hostFixture{home: filepath.Join(dir, "home"), outside: filepath.Join(dir, "outside"), layer: filepath.Join(dir, "layer")}
	writeFile(t, filepath.Join(h.home, ".gitconfig"), "[user]\n\tname = dev\n", 0o600)
	writeFile(t, filepath.Join(h.home, "dotfiles", "gh", "config.yml"), "git_protocol: ssh\n", 0o644)
	writeFile(t, filepath.Join(h.home, "dotfiles", "gh", "hosts", "github.com.yml"), "user: dev\n", 0o600)
	mkdir(t, filepath.Join(h.home, "dotfiles", "gh"), 0o700)
	writeFile(t, filepath.Join(h.home, "dotfiles", "bashrc"), "export A=1\n", 0o644)
	symlink(t, "dotfiles/bashrc", filepath.Join(h.home, ".bashrc")) // the source itself is a link: followed
	writeFile(t, filepath.Join(h.outside, "npmrc"), "registry=x\n", 0o640)
	writeFile(t, filepath.Join(h.home, "bin", "setup.sh"), "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, filepath.Join(h.home, "bin", "plain.sh"), "echo no x bit\n", 0o644)
	// A tree with links inside and out.
	links := filepath.Join(h.home, "links")
	writeFile(t, filepath.Join(links, "sub", "file"), "inside\n", 0o644)
	symlink(t, "sub/file", filepath.Join(links, "in"))
	symlink(t, "in", filepath.Join(links, "chain"))
	symlink(t, "../file", filepath.Join(links, "sub", "up"))
	symlink(t, "../../outside/npmrc", filepath.Join(links, "out"))
	symlink(t, "sub/../../home/.gitconfig", filepath.Join(links, "sneaky"))
	symlink(t, filepath.Join(links, "sub", "file"), filepath.Join(links, "abs"))
	// A .claude directory holding its own settings.json.
	writeFile(t, filepath.Join(h.home, "claude", "settings.json"), `{"from": "host"}`, 0o644)
	writeFile(t, filepath.Join(h.home, "claude", "CLAUDE.md"), "memory\n", 0o644)
	writeFile(t, filepath.Join(h.layer, "settings.json"), `{"from": "snippet"}`, 0o644)
	return h
}

func TestHomeMappings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		home     func(h hostFixture) map[string]provision.HomeMapping
		snippets bool // put a snippet in the layer, so a merged .claude/settings.json exists
		files    map[string]want
		hooks    []provision.Hook
		warnings []string
		err      []string // substrings of the error; the plan must then be empty
	}{
		{
			name: "empty source is the same path under the host home",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".gitconfig": {}}
			},
			files: map[string]want{".gitconfig": {mode: 0o600, content: "[user]\n\tname = dev\n"}},
		},
		{
			name: "tilde directory",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".config/gh": {Source: "~/dotfiles/gh"}}
			},
			files: map[string]want{
				".config/gh":                      {dir: true, mode: 0o700},
				".config/gh/config.yml":           {mode: 0o644, content: "git_protocol: ssh\n"},
				".config/gh/hosts":                {dir: true, mode: 0o755},
				".config/gh/hosts/github.com.yml": {mode: 0o600, content: "user: dev\n"},
			},
		},
		{
			name: "absolute source and a cleaned target",
			home: func(h hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"./.npmrc": {Source: filepath.Join(h.outside, "npmrc")}}
			},
			files: map[string]want{".npmrc": {mode: 0o640, content: "registry=x\n"}},
		},
		{
			name: "a source that is itself a link is followed",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".bashrc": {}}
			},
			files: map[string]want{".bashrc": {mode: 0o644, content: "export A=1\n"}},
		},
		{
			name: "missing source",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".aws": {}, ".gitconfig": {}}
			},
			err: []string{`home mapping ".aws": source `, "does not exist; create it, fix the source, or mark the mapping optional = true"},
		},
		{
			name: "optional missing source",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".aws": {Optional: true}, ".gitconfig": {}}
			},
			files: map[string]want{".gitconfig": {mode: 0o600, content: "[user]\n\tname = dev\n"}},
		},
		{
			name: "dotdot target",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"../etc/profile": {Source: "~/.gitconfig"}, ".gitconfig": {}}
			},
			err: []string{`home mapping "../etc/profile": target contains ".."`},
		},
		{
			name: "dotdot inside a target",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"a/../../x": {Source: "~/.gitconfig"}}
			},
			err: []string{`home mapping "a/../../x": target contains ".."`},
		},
		{
			name: "absolute target",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"/etc/profile": {Source: "~/.gitconfig"}}
			},
			err: []string{`home mapping "/etc/profile": target is absolute; use a path relative to /home/dev`},
		},
		{
			name: "target on the agent config",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".claude/settings.json": {Source: "~/claude/settings.json"}}
			},
			err: []string{`home mapping ".claude/settings.json": target lands on the agent's config file .claude/settings.json`, "put the settings in a snippet in "},
		},
		{
			name: "target inside the agent config",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".claude/settings.json/x": {Source: "~/.gitconfig"}}
			},
			err: []string{`home mapping ".claude/settings.json/x": target lands on the agent's config file`},
		},
		{
			name: "a directory holding the agent config gives way to the merged one",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".claude": {Source: "~/claude"}}
			},
			snippets: true,
			files: map[string]want{
				".claude":               {dir: true, mode: 0o755},
				".claude/CLAUDE.md":     {mode: 0o644, content: "memory\n"},
				".claude/settings.json": {mode: 0o644, content: "{\n  \"from\": \"snippet\"\n}\n"},
			},
			warnings: []string{filepath.Join("claude", "settings.json") + ": not provisioned: .claude/settings.json is the agent's config, merged from snippets"},
		},
		{
			name: "links inside are kept, links out are skipped",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"links": {Source: "~/links"}}
			},
			files: map[string]want{
				"links":          {dir: true, mode: 0o755},
				"links/chain":    {link: true, content: "in"},
				"links/in":       {link: true, content: "sub/file"},
				"links/sub":      {dir: true, mode: 0o755},
				"links/sub/file": {mode: 0o644, content: "inside\n"},
				"links/sub/up":   {link: true, content: "../file"},
			},
			warnings: []string{
				"/links/abs: skipped: symbolic link to /",
				"/links/out: skipped: symbolic link to ../../outside/npmrc leads out of ~/links",
				"/links/sneaky: skipped: symbolic link to sub/../../home/.gitconfig leads out of ~/links",
			},
		},
		{
			name: "startup hook",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"bin/setup.sh": {Source: "~/bin/setup.sh", Hook: "startup", Root: true}}
			},
			files: map[string]want{"bin/setup.sh": {mode: 0o755, content: "#!/bin/sh\necho hi\n"}},
			hooks: []provision.Hook{{Path: "/home/dev/bin/setup.sh", Root: true}},
		},
		{
			name: "hook not executable",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"bin/plain.sh": {Source: "~/bin/plain.sh", Hook: "startup"}}
			},
			err: []string{`home mapping "bin/plain.sh": hook = "startup" runs the file directly, but `, "is not executable; run chmod +x"},
		},
		{
			name: "hook on a directory",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"bin": {Source: "~/bin", Hook: "startup"}}
			},
			err: []string{`home mapping "bin": hook = "startup" needs a file`},
		},
		{
			name: "unknown hook kind",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"bin/setup.sh": {Source: "~/bin/setup.sh", Hook: "shutdown"}}
			},
			err: []string{`hook = "shutdown" is not a hook kind`},
		},
		{
			name: "tilde user",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".npmrc": {Source: "~root/.npmrc"}}
			},
			err: []string{"~user is not supported"},
		},
		{
			name: "unresolved relative source",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{".npmrc": {Source: "files/npmrc"}}
			},
			err: []string{`source "files/npmrc" is relative`},
		},
		{
			name: "every rejected mapping is reported",
			home: func(hostFixture) map[string]provision.HomeMapping {
				return map[string]provision.HomeMapping{"/abs": {}, ".missing": {}, ".gitconfig": {}}
			},
			err: []string{`home mapping "/abs": target is absolute`, `home mapping ".missing": source`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHost(t)
			in := provision.Input{
				Config:   ".claude/settings.json",
				Snippets: []string{"*.json"},
				Home:     tt.home(h),
				HostHome: h.home,
				Layers:   []provision.Layer{{Name: provision.LayerUser, Dir: filepath.Join(h.home, "no-layer")}},
			}
			if tt.snippets {
				in.Layers = []provision.Layer{{Name: provision.LayerUser, Dir: h.layer}}
			}
			plan, err := provision.Build(in)
			if tt.err != nil {
				if err == nil {
					t.Fatalf("Build succeeded with %d files, want an error", len(plan.Files))
				}
				t.Log(err)
				var me *provision.MappingError
				if !errors.As(err, &me) {
					t.Errorf("err %v holds no *MappingError", err)
				}
				for _, w := range tt.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err = %q, want it to contain %q", err, w)
					}
				}
				if len(plan.Files) != 0 || len(plan.Hooks) != 0 || len(plan.Remove) != 0 {
					t.Errorf("a rejected plan still holds %d files, %d hooks, %d removals", len(plan.Files), len(plan.Hooks), len(plan.Remove))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkFiles(t, plan, tt.files)
			checkWarnings(t, plan.Warnings, tt.warnings...)
			if len(plan.Hooks) != len(tt.hooks) {
				t.Fatalf("hooks = %v, want %v", plan.Hooks, tt.hooks)
			}
			for i := range tt.hooks {
				if plan.Hooks[i] != tt.hooks[i] {
					t.Errorf("hook %d = %v, want %v", i, plan.Hooks[i], tt.hooks[i])
				}
			}
		})
	}
}

// TestHomeMappingRelativeToConfig loads a real project config whose [home]
// source is relative to the file, converts the mapping and provisions it.
func TestHomeMappingRelativeToConfig(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	project := filepath.Join(h.outside, "project")
	writeFile(t, filepath.Join(project, ".agents-sandbox", "files", "npmrc"), "registry=project\n", 0o600)
	writeFile(t, filepath.Join(project, ".agents-sandbox", "config.toml"),
		"[home]\n\".npmrc\" = \"files/npmrc\"\n\".gitconfig\" = {}\n\".aws\" = { optional = true }\n", 0o644)
	loaded, err := sandbox.LoadConfig(sandbox.ConfigSources{ProjectFile: filepath.Join(project, ".agents-sandbox", "config.toml")})
	if err != nil {
		t.Fatal(err)
	}
	home := map[string]provision.HomeMapping{}
	for target, m := range loaded.Config.Home {
		home[target] = provision.HomeMapping(m) // same fields: a plain conversion
	}
	plan, err := provision.Build(provision.Input{Home: home, HostHome: h.home})
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, plan, map[string]want{
		".npmrc":     {mode: 0o600, content: "registry=project\n"},
		".gitconfig": {mode: 0o600, content: "[user]\n\tname = dev\n"},
	})
	f, _ := plan.Lookup(".npmrc")
	if want := filepath.Join(project, ".agents-sandbox", "files", "npmrc"); f.Origin != want {
		t.Errorf("origin = %q, want %q", f.Origin, want)
	}
}

func TestHomeMappingNeedsHostHome(t *testing.T) {
	t.Parallel()
	_, err := provision.Build(provision.Input{Home: map[string]provision.HomeMapping{".gitconfig": {}}})
	if err == nil || !strings.Contains(err.Error(), "host's home is not known") {
		t.Errorf("err = %v", err)
	}
}

// A mapping and a layer file at the same path: the layer wins.
func TestLayerOverridesHomeMapping(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	writeFile(t, filepath.Join(h.layer, "CLAUDE.md"), "from the layer\n", 0o644)
	plan, err := provision.Build(provision.Input{
		Config:   ".claude/settings.json",
		Snippets: []string{"*.json"},
		Layers:   []provision.Layer{{Name: provision.LayerUser, Dir: h.layer}},
		Home:     map[string]provision.HomeMapping{".claude/CLAUDE.md": {Source: "~/claude/CLAUDE.md"}},
		HostHome: h.home,
	})
	if err != nil {
		t.Fatal(err)
	}
	if f, _ := plan.Lookup(".claude/CLAUDE.md"); string(f.Content) != "from the layer\n" {
		t.Errorf("CLAUDE.md = %q", f.Content)
	}
}
