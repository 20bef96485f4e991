package provision_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/tailscale/hujson"

	"github.com/agents-sandbox/agents-sandbox/sandbox/provision"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/<name>.golden, rewriting it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	file := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read golden (run go test -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, file, got, want)
	}
}

// layersOf returns the user, repo and project layers of a merge test case;
// missing ones are empty layers.
func layersOf(dir string) []provision.Layer {
	return []provision.Layer{
		{Name: provision.LayerUser, Dir: filepath.Join(dir, "user")},
		{Name: provision.LayerRepo, Dir: filepath.Join(dir, "repo")},
		{Name: provision.LayerProject, Dir: filepath.Join(dir, "project")},
	}
}

func TestMergeGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		config   string
		patterns []string
		snippets int      // how many snippets were merged
		warnings []string // substrings, one per expected warning, in order
		check    func(t *testing.T, out []byte)
	}{
		{
			name:     "opencode",
			config:   ".config/opencode/opencode.jsonc",
			patterns: []string{"*.json", "*.jsonc"},
			snippets: 4,
			check: func(t *testing.T, out []byte) {
				var m map[string]any
				if err := json.Unmarshal(out, &m); err != nil {
					t.Fatalf("merged opencode config is not JSON: %v", err)
				}
				if _, ok := m["theme"]; ok {
					t.Error("theme: null in the project layer did not delete the user's theme")
				}
				prov := m["provider"].(map[string]any)
				if _, ok := prov["openai"]; ok {
					t.Error("provider.openai: null in the repo layer did not delete it")
				}
				opts := prov["anthropic"].(map[string]any)["options"].(map[string]any)
				if opts["timeout"] != 120000.0 || opts["baseURL"] != "https://api.anthropic.com/v1" {
					t.Errorf("nested merge across layers: options = %v", opts)
				}
				if got := m["instructions"].([]any); len(got) != 1 || got[0] != "README.md" {
					t.Errorf("array not replaced: instructions = %v", got)
				}
				tools := m["tools"].(map[string]any)
				if tools["write"] != false || tools["bash"] != true || tools["edit"] != true {
					t.Errorf("tools = %v", tools)
				}
				if !bytes.Contains(out, []byte("12345678901234567890123")) || !bytes.Contains(out, []byte("1.50")) {
					t.Error("numbers are not kept verbatim")
				}
			},
		},
		{
			name:     "claude",
			config:   ".claude/settings.json",
			patterns: []string{"*.json"},
			snippets: 3,
			check: func(t *testing.T, out []byte) {
				var m map[string]any
				if err := json.Unmarshal(out, &m); err != nil {
					t.Fatal(err)
				}
				if _, ok := m["model"]; ok {
					t.Error("model: null did not delete")
				}
				perm := m["permissions"].(map[string]any)
				if len(perm["allow"].([]any)) != 1 || len(perm["deny"].([]any)) != 1 || perm["defaultMode"] != "acceptEdits" {
					t.Errorf("permissions = %v", perm)
				}
			},
		},
		{
			name:     "codex",
			config:   ".codex/config.toml",
			patterns: []string{"*.toml"},
			snippets: 3,
			check: func(t *testing.T, out []byte) {
				var m map[string]any
				if _, err := toml.Decode(string(out), &m); err != nil {
					t.Fatalf("merged codex config is not TOML: %v", err)
				}
				docs := m["mcp_servers"].(map[string]any)["docs"].(map[string]any)
				if docs["command"] != "npx" || len(docs["args"].([]any)) != 2 || docs["env"] == nil {
					t.Errorf("mcp_servers.docs = %v", docs)
				}
				if m["model_reasoning_effort"] != "high" || m["model"] != "gpt-5-codex" {
					t.Errorf("scalars: %v %v", m["model_reasoning_effort"], m["model"])
				}
			},
		},
		{
			name:     "typeclash",
			config:   ".config/opencode/opencode.jsonc",
			patterns: []string{"*.json", "*.jsonc"},
			snippets: 2,
			warnings: []string{
				`key model: an object replaces the string set by `,
				`key provider: a string replaces the object set by `,
				`key tools: an object replaces the array set by `,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join("testdata", "merge", tt.name)
			plan, err := provision.Build(provision.Input{Layers: layersOf(dir), Config: tt.config, Snippets: tt.patterns})
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			if plan.Config != tt.config || len(plan.Snippets) != tt.snippets {
				t.Fatalf("Config = %q, Snippets = %q", plan.Config, plan.Snippets)
			}
			f, ok := plan.Lookup(tt.config)
			if !ok {
				t.Fatalf("no %s in plan", tt.config)
			}
			golden(t, filepath.Join("merge", tt.name), f.Content)
			if tt.check != nil {
				tt.check(t, f.Content)
			}
			if len(plan.Warnings) != len(tt.warnings) {
				t.Fatalf("warnings = %v, want %d", plan.Warnings, len(tt.warnings))
			}
			for i, w := range tt.warnings {
				t.Log(plan.Warnings[i])
				if s := plan.Warnings[i].String(); !strings.Contains(s, w) || !strings.Contains(s, filepath.Join("user", "a.json")) {
					t.Errorf("warning %d = %q, want it to contain %q and the lower file", i, s, w)
				}
			}
			// Deterministic: a second build gives the same bytes.
			again, err := provision.Build(provision.Input{Layers: layersOf(dir), Config: tt.config, Snippets: tt.patterns})
			if err != nil {
				t.Fatal(err)
			}
			if g, _ := again.Lookup(tt.config); !bytes.Equal(g.Content, f.Content) {
				t.Error("a second Build gave different output")
			}
		})
	}
}

func TestMergeParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file, data string
		want             string // the error's position and message start
	}{
		{"missing colon", "a.jsonc", "{\n  // fine\n  \"model\" \"x\"\n}\n", "a.jsonc:3:11: invalid character"},
		{"unterminated comment", "a.jsonc", "{\n  \"a\": 1 /* open\n}\n", "a.jsonc:2:"},
		{"not an object", "a.json", "// a list\n[1, 2]\n", "a.json:2:1: a snippet must be a JSON object ({...}), not array"},
		{"toml syntax", "c.toml", "model = \"x\"\neffort = high\n", "c.toml:2:10: "},
		{"toml duplicate", "c.toml", "a = 1\na = 2\n", "c.toml:2:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "project", tt.file), tt.data, 0o644)
			cfg := ".config/opencode/opencode.jsonc"
			if strings.HasSuffix(tt.file, ".toml") {
				cfg = ".codex/config.toml"
			}
			_, err := provision.Build(provision.Input{
				Layers:   layersOf(dir),
				Config:   cfg,
				Snippets: []string{"*.json", "*.jsonc", "*.toml"},
			})
			var se *provision.SnippetError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want a *SnippetError", err)
			}
			t.Log(err)
			full := filepath.Join(dir, "project", tt.file)
			if se.File != full || se.Line == 0 || se.Column == 0 {
				t.Errorf("SnippetError = %+v, want file %s with a position", se, full)
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, "project", tt.want)) {
				t.Errorf("error = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestMergeEmptyAndCommentOnlySnippets(t *testing.T) {
	t.Parallel()
	out, warns, err := provision.Merge([]provision.Snippet{
		{Name: "a.jsonc", Data: []byte("{\"a\": 1}")},
		{Name: "b.jsonc", Data: nil},
		{Name: "c.jsonc", Data: []byte("// nothing yet\n/* really */\n")},
	}, provision.FormatJSON)
	if err != nil || len(warns) != 0 {
		t.Fatalf("Merge: %v %v", err, warns)
	}
	if string(out) != "{\n  \"a\": 1\n}\n" {
		t.Errorf("out = %q", out)
	}
}

// TestMergeAcrossFormats merges a JSON snippet into a TOML config and back.
func TestMergeAcrossFormats(t *testing.T) {
	t.Parallel()
	out, _, err := provision.Merge([]provision.Snippet{
		{Name: "a.toml", Data: []byte("n = 1\nf = 2.5\n[t]\nx = \"y\"\n")},
		{Name: "b.json", Data: []byte(`{"t": {"z": 3}, "big": 1e400}`)},
	}, provision.FormatTOML)
	if err == nil || !strings.Contains(err.Error(), "big") {
		t.Errorf("a JSON number out of TOML's range: out %q, err %v", out, err)
	}
	out, _, err = provision.Merge([]provision.Snippet{
		{Name: "a.toml", Data: []byte("n = 1\nf = 2.5\n[t]\nx = \"y\"\n")},
		{Name: "b.json", Data: []byte(`{"t": {"z": 3, "x": null}}`)},
	}, provision.FormatTOML)
	if err != nil {
		t.Fatal(err)
	}
	if want := "f = 2.5\nn = 1\n\n[t]\nz = 3\n"; string(out) != want {
		t.Errorf("out = %q, want %q", out, want)
	}
	if _, _, err := provision.Merge([]provision.Snippet{{Name: "a.json", Data: []byte(`{"l": [1, null]}`)}}, provision.FormatTOML); err == nil {
		t.Error("a null inside an array was written as TOML")
	}
}

// FuzzMerge merges two JSONC snippets: it never panics, and whatever it
// writes parses again, as JSON and as JSONC, and merges to itself.
func FuzzMerge(f *testing.F) {
	for _, s := range [][2]string{
		{`{"a": {"b": 1, "c": [1,2]}, "d": "x"}`, `{"a": {"b": null, "c": [3]}, "d": {"e": true}}`},
		{"// c\n{\"a\": 1,}", "{/* */ \"a\": null, \"b\": [null, {}],}"},
		{`{"a": 1e400, "b": "<&>"}`, `{"a": {"": {"x": -0.0}}}`},
		{`[1]`, `{}`},
		{``, `{"a"`},
		{"{\"\\u00e9\\ud83d\\ude00\": \"\\\"\"}", `{"a": {"b": {"c": {"d": null}}}}`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		out, _, err := provision.Merge([]provision.Snippet{
			{Name: "a.jsonc", Data: a}, {Name: "b.jsonc", Data: b},
		}, provision.FormatJSON)
		if err != nil {
			var se *provision.SnippetError
			if !errors.As(err, &se) || (se.File != "a.jsonc" && se.File != "b.jsonc") {
				t.Fatalf("error %v is not a *SnippetError naming a snippet", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("output is not JSON: %q", out)
		}
		if _, err := hujson.Parse(out); err != nil {
			t.Fatalf("output is not JSONC: %v", err)
		}
		again, _, err := provision.Merge([]provision.Snippet{{Name: "out.json", Data: out}}, provision.FormatJSON)
		if err != nil {
			t.Fatalf("output does not merge again: %v\n%q", err, out)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("merging the output alone changed it:\n%q\n%q", out, again)
		}
		// The same snippets written as TOML: an error (null in an array, a
		// number TOML cannot hold) or TOML that parses.
		tout, _, err := provision.Merge([]provision.Snippet{
			{Name: "a.jsonc", Data: a}, {Name: "b.jsonc", Data: b},
		}, provision.FormatTOML)
		if err == nil {
			var m map[string]any
			if _, err := toml.Decode(string(tout), &m); err != nil {
				t.Fatalf("TOML output does not parse: %v\n%s", err, tout)
			}
		}
	})
}

func writeFile(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask-proof
		t.Fatal(err)
	}
}
