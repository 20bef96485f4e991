package provision_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox/provision"
)

func symlink(t *testing.T, target, at string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, at); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// want describes one expected plan entry.
type want struct {
	mode    fs.FileMode
	content string // file content, or link target when link is set
	dir     bool
	link    bool
}

func checkFiles(t *testing.T, plan provision.Plan, wants map[string]want) {
	t.Helper()
	var got []string
	for _, f := range plan.Files {
		got = append(got, f.Path)
	}
	var exp []string
	for p := range wants {
		exp = append(exp, p)
	}
	slices.Sort(exp)
	if !slices.Equal(got, exp) {
		t.Fatalf("plan paths:\n got  %q\n want %q", got, exp)
	}
	for _, f := range plan.Files {
		w := wants[f.Path]
		switch {
		case w.dir:
			if !f.Dir || f.Mode != w.mode {
				t.Errorf("%s: dir %v mode %v, want a directory with mode %v", f.Path, f.Dir, f.Mode, w.mode)
			}
		case w.link:
			if !f.IsLink() || f.LinkTarget != w.content {
				t.Errorf("%s: link target %q, want %q", f.Path, f.LinkTarget, w.content)
			}
		default:
			if f.Dir || f.IsLink() || string(f.Content) != w.content || f.Mode != w.mode || f.Size != int64(len(w.content)) {
				t.Errorf("%s: content %q mode %v size %d, want %q mode %v", f.Path, f.Content, f.Mode, f.Size, w.content, w.mode)
			}
		}
	}
}

func checkWarnings(t *testing.T, got []provision.Warning, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("warnings = %v, want %d matching %q", got, len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(got[i].String(), w) {
			t.Errorf("warning %d = %q, want it to contain %q", i, got[i], w)
		}
	}
}

func TestMirrorLayers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	user := filepath.Join(dir, "config", "agents-sandbox", "opencode")
	repo := filepath.Join(dir, "config", "agents-sandbox", "repo-1234", "opencode")
	project := filepath.Join(dir, "project", ".agents-sandbox", "opencode")
	writeFile(t, filepath.Join(dir, "secret"), "host secret", 0o600)

	writeFile(t, filepath.Join(user, "base.jsonc"), `{"model": "a", "theme": "x", /* c */}`, 0o644)
	writeFile(t, filepath.Join(user, "AGENTS.md"), "user rules", 0o644)
	writeFile(t, filepath.Join(user, "agent", "review.md"), "user review", 0o600)
	writeFile(t, filepath.Join(user, "bin", "tool.sh"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(user, "themes", "dark.json"), `{"not": "a snippet"}`, 0o644)
	writeFile(t, filepath.Join(user, "prompts", "a.md"), "a", 0o644)
	writeFile(t, filepath.Join(user, "config"), "legacy = true", 0o644) // opencode's legacy TOML config
	symlink(t, "AGENTS.md", filepath.Join(user, "rules.md"))
	symlink(t, "../../../secret", filepath.Join(user, "leak.md"))
	symlink(t, "../../../secret", filepath.Join(user, "leak.json")) // a snippet link out of the layer
	symlink(t, "agent/../base.jsonc", filepath.Join(user, "zz-again.jsonc"))
	mkdir(t, filepath.Join(user, "empty"), 0o700)

	writeFile(t, filepath.Join(repo, "AGENTS.md"), "repo rules", 0o640)
	writeFile(t, filepath.Join(repo, "opencode.json"), `{"theme": null, "model": "b"}`, 0o600)

	writeFile(t, filepath.Join(project, "agent", "review.md"), "project review", 0o644)
	writeFile(t, filepath.Join(project, "prompts"), "a file now", 0o644)
	writeFile(t, filepath.Join(project, "Dockerfile.not-here"), "x", 0o644)

	plan, err := provision.Build(provision.Input{
		Layers:   provision.StandardLayers(filepath.Join(dir, "config", "agents-sandbox"), "repo-1234", filepath.Join(dir, "project"), "opencode"),
		Config:   ".config/opencode/opencode.jsonc",
		Snippets: []string{"*.json", "*.jsonc"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := ".config/opencode/"
	checkFiles(t, plan, map[string]want{
		c + "AGENTS.md":           {mode: 0o640, content: "repo rules"},
		c + "agent":               {dir: true, mode: 0o755},
		c + "agent/review.md":     {mode: 0o644, content: "project review"},
		c + "bin":                 {dir: true, mode: 0o755},
		c + "bin/tool.sh":         {mode: 0o755, content: "#!/bin/sh\n"},
		c + "empty":               {dir: true, mode: 0o700},
		c + "themes":              {dir: true, mode: 0o755},
		c + "themes/dark.json":    {mode: 0o644, content: `{"not": "a snippet"}`},
		c + "prompts":             {mode: 0o644, content: "a file now"},
		c + "rules.md":            {link: true, content: "AGENTS.md"},
		c + "Dockerfile.not-here": {mode: 0o644, content: "x"},
		// The merged config takes the mode of the highest snippet.
		c + "opencode.jsonc": {mode: 0o600, content: "{\n  \"model\": \"b\"\n}\n"},
	})
	if plan.Config != c+"opencode.jsonc" {
		t.Errorf("Config = %q", plan.Config)
	}
	wantSnippets := []string{filepath.Join(user, "base.jsonc"), filepath.Join(user, "zz-again.jsonc"), filepath.Join(repo, "opencode.json")}
	if !slices.Equal(plan.Snippets, wantSnippets) {
		t.Errorf("Snippets = %q, want %q", plan.Snippets, wantSnippets)
	}
	if want := []string{c + "config", c + "config.json", c + "opencode.json"}; !slices.Equal(plan.Remove, want) {
		t.Errorf("Remove = %q, want %q", plan.Remove, want)
	}
	checkWarnings(t, plan.Warnings,
		filepath.Join(user, "leak.json")+": snippet skipped: it is a symbolic link that leads out",
		filepath.Join(user, "leak.md")+": skipped: symbolic link to ../../../secret leads out of "+user,
		filepath.Join(user, "prompts", "a.md")+": not provisioned: "+filepath.Join(project, "prompts")+" puts a file at "+c+"prompts",
		filepath.Join(user, "prompts")+": not provisioned at "+c+"prompts: replaced by "+filepath.Join(project, "prompts"),
		filepath.Join(user, "config")+": not provisioned: the agent would read it as config next to the merged "+c+"opencode.jsonc",
	)
}

// Without snippets nothing is merged, nothing removed, and a file at a path
// the agent reads as config is mirrored like any other.
func TestMirrorWithoutSnippets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "user", "config"), "legacy", 0o644)
	writeFile(t, filepath.Join(dir, "project", "AGENTS.md"), "rules", 0o644)
	plan, err := provision.Build(provision.Input{Layers: layersOf(dir), Config: ".config/opencode/opencode.jsonc", Snippets: []string{"*.json", "*.jsonc"}})
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, plan, map[string]want{
		".config/opencode/config":    {mode: 0o644, content: "legacy"},
		".config/opencode/AGENTS.md": {mode: 0o644, content: "rules"},
	})
	if plan.Config != "" || len(plan.Remove) != 0 || len(plan.Snippets) != 0 || len(plan.Warnings) != 0 {
		t.Errorf("plan = %+v", plan)
	}
}

func TestNoAgentConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "user", "x.json"), "{}", 0o644)
	plan, err := provision.Build(provision.Input{Layers: layersOf(dir)})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Files) != 0 {
		t.Errorf("files = %v", plan.Files)
	}
	checkWarnings(t, plan.Warnings, "the agent reads no config file")
}

func TestBuildRejectsBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "user"), "not a directory", 0o644)
	tests := []struct {
		name string
		in   provision.Input
		want string
	}{
		{"absolute config", provision.Input{Config: "/home/dev/.claude/settings.json"}, "is absolute"},
		{"escaping config", provision.Input{Config: "../x.json"}, `contains ".."`},
		{"unknown format", provision.Input{Config: ".x/config.yaml"}, "unknown extension"},
		{"bad pattern", provision.Input{Config: ".claude/settings.json", Snippets: []string{"[*.json"}}, "syntax error in pattern"},
		{"layer is a file", provision.Input{Config: ".claude/settings.json", Layers: layersOf(dir)}, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := provision.Build(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestShadowed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		config string
		want   []string
	}{
		{".config/opencode/opencode.jsonc", []string{".config/opencode/config", ".config/opencode/config.json", ".config/opencode/opencode.json"}},
		{".config/opencode/opencode.json", []string{".config/opencode/config", ".config/opencode/config.json", ".config/opencode/opencode.jsonc"}},
		{".claude/settings.json", nil},
		{".codex/config.toml", nil},
		{".myagent/config.json", nil},
	}
	for _, tt := range tests {
		if got := provision.Shadowed(tt.config); !slices.Equal(got, tt.want) {
			t.Errorf("Shadowed(%q) = %q, want %q", tt.config, got, tt.want)
		}
	}
}

// A FIFO named like a snippet, or anywhere in a layer or mapping, is skipped
// without blocking on it.
func TestSpecialFilesSkipped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, p := range []string{filepath.Join(dir, "user", "x.json"), filepath.Join(dir, "user", "sub", "fifo"), filepath.Join(dir, "src", "fifo")} {
		mkdir(t, filepath.Dir(p), 0o755)
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "user", "y.json"), `{"y": 1}`, 0o644)
	plan, err := provision.Build(provision.Input{
		Layers:   layersOf(dir),
		Config:   ".claude/settings.json",
		Snippets: []string{"*.json"},
		Home:     map[string]provision.HomeMapping{"m": {Source: filepath.Join(dir, "src")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, plan, map[string]want{
		"m":                     {dir: true, mode: 0o755},
		".claude/sub":           {dir: true, mode: 0o755},
		".claude/settings.json": {mode: 0o644, content: "{\n  \"y\": 1\n}\n"},
	})
	checkWarnings(t, plan.Warnings,
		filepath.Join(dir, "src", "fifo")+": skipped: a named pipe is neither",
		filepath.Join(dir, "user", "x.json")+": skipped: not a regular file",
		filepath.Join(dir, "user", "sub", "fifo")+": skipped: a named pipe is neither",
	)
	// A FIFO as the source of a file mapping is refused, not read.
	_, err = provision.Build(provision.Input{Home: map[string]provision.HomeMapping{"f": {Source: filepath.Join(dir, "src", "fifo")}}})
	if err == nil || !strings.Contains(err.Error(), "neither a file nor a directory") {
		t.Errorf("err = %v", err)
	}
}
