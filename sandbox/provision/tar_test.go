package provision_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox/provision"
)

// tarPlan builds a plan with a merged config, mirrored files, a directory
// mapping with special modes and links.
func tarPlan(t *testing.T) provision.Plan {
	t.Helper()
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	writeFile(t, filepath.Join(dir, "user", "a.jsonc"), `{"a": 1}`, 0o600)
	writeFile(t, filepath.Join(dir, "user", "agents", "x.md"), "x\n", 0o644)
	writeFile(t, filepath.Join(home, "tools", "suid"), "#!/bin/sh\n", 0o755|os.ModeSetuid)
	writeFile(t, filepath.Join(home, "tools", "empty"), "", 0o640)
	mkdir(t, filepath.Join(home, "tools", "shared"), 0o777|os.ModeSticky)
	mkdir(t, filepath.Join(home, "tools"), 0o750)
	symlink(t, "suid", filepath.Join(home, "tools", "run"))
	plan, err := provision.Build(provision.Input{
		Layers:   layersOf(dir),
		Config:   ".config/opencode/opencode.jsonc",
		Snippets: []string{"*.jsonc"},
		Home:     map[string]provision.HomeMapping{".local/share/tools": {Source: "~/tools"}},
		HostHome: home,
	})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func TestTarRoundTrip(t *testing.T) {
	t.Parallel()
	plan := tarPlan(t)
	var buf bytes.Buffer
	if err := plan.Tar(&buf, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		typ     byte
		mode    int64
		content string
	}
	want := []struct {
		name string
		entry
	}{
		{".config/", entry{tar.TypeDir, 0o755, ""}},
		{".config/opencode/", entry{tar.TypeDir, 0o755, ""}},
		{".config/opencode/agents/", entry{tar.TypeDir, 0o755, ""}},
		{".config/opencode/agents/x.md", entry{tar.TypeReg, 0o644, "x\n"}},
		{".config/opencode/opencode.jsonc", entry{tar.TypeReg, 0o600, "{\n  \"a\": 1\n}\n"}},
		{".local/", entry{tar.TypeDir, 0o755, ""}},
		{".local/share/", entry{tar.TypeDir, 0o755, ""}},
		{".local/share/tools/", entry{tar.TypeDir, 0o750, ""}},
		{".local/share/tools/empty", entry{tar.TypeReg, 0o640, ""}},
		{".local/share/tools/run", entry{tar.TypeSymlink, 0o777, "suid"}},
		{".local/share/tools/shared/", entry{tar.TypeDir, 0o1777, ""}},
		{".local/share/tools/suid", entry{tar.TypeReg, 0o4755, "#!/bin/sh\n"}},
	}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	var i int
	for ; ; i++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i >= len(want) {
			t.Fatalf("extra entry %q", h.Name)
		}
		w := want[i]
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got := entry{h.Typeflag, h.Mode, string(body)}
		if h.Typeflag == tar.TypeSymlink {
			got.content = h.Linkname
		}
		if h.Name != w.name || got != w.entry {
			t.Errorf("entry %d = %q %+v, want %q %+v", i, h.Name, got, w.name, w.entry)
		}
		if h.Uid != 1234 || h.Gid != 5678 {
			t.Errorf("%s owned by %d:%d, want 1234:5678", h.Name, h.Uid, h.Gid)
		}
		if strings.HasPrefix(h.Name, "/") || strings.HasPrefix(h.Name, "./") || strings.Contains(h.Name, "..") {
			t.Errorf("entry name %q is not relative to /home/dev", h.Name)
		}
		if h.ModTime.Unix() != 0 {
			t.Errorf("%s: mtime %v, want the epoch", h.Name, h.ModTime)
		}
	}
	if i != len(want) {
		t.Errorf("%d entries, want %d", i, len(want))
	}

	var again bytes.Buffer
	if err := tarPlan(t).Tar(&again, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("the same sources gave a different archive")
	}
}

func TestTarRejectsBadPaths(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"../x", "/etc/passwd", ""} {
		plan := provision.Plan{Files: []provision.File{{Path: p, Mode: 0o644, Content: []byte("x")}}}
		if err := plan.Tar(io.Discard, 0, 0); err == nil {
			t.Errorf("Tar wrote an entry at %q", p)
		}
	}
}

func TestDiff(t *testing.T) {
	t.Parallel()
	plan := tarPlan(t)
	cfg, _ := plan.Lookup(".config/opencode/opencode.jsonc")
	all := plan.Hashes()
	if _, ok := all[".config/opencode"]; ok {
		t.Fatal("Hashes lists a directory")
	}
	if len(all) != 5 {
		t.Fatalf("Hashes = %v, want the 5 files and links", all)
	}
	files := slices.Sorted(func(yield func(string) bool) {
		for p := range all {
			if !yield(p) {
				return
			}
		}
	})

	changed := map[string]string{}
	for p, h := range all {
		changed[p] = h
	}
	changed[cfg.Path] = strings.Repeat("0", 64)
	changed[".config/opencode/agents/gone.md"] = strings.Repeat("1", 64)
	changed[".local/share/tools/shared"] = strings.Repeat("2", 64) // was a file, now a directory
	changed["../../etc/passwd"] = strings.Repeat("3", 64)          // corrupt state never reaches outside
	changed["/etc/shadow"] = strings.Repeat("3", 64)
	changed["a/../b"] = strings.Repeat("3", 64)

	tests := []struct {
		name                     string
		previous                 map[string]string
		write, remove, unchanged []string
	}{
		{"first run", nil, files, nil, nil},
		{"nothing changed", all, nil, nil, files},
		{
			"changed, gone and replaced",
			changed,
			[]string{cfg.Path},
			[]string{".config/opencode/agents/gone.md", ".local/share/tools/shared"},
			slices.DeleteFunc(slices.Clone(files), func(p string) bool { return p == cfg.Path }),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w, r, u := provision.Diff(tt.previous, plan)
			if !slices.Equal(w, tt.write) || !slices.Equal(r, tt.remove) || !slices.Equal(u, tt.unchanged) {
				t.Errorf("Diff:\n write     %q want %q\n remove    %q want %q\n unchanged %q want %q", w, tt.write, r, tt.remove, u, tt.unchanged)
			}
		})
	}

	// A file that became a link is rewritten even with the same bytes.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src", "t"), "x", 0o644)
	writeFile(t, filepath.Join(dir, "src", "l"), "t", 0o644)
	asFile, err := provision.Build(provision.Input{Home: map[string]provision.HomeMapping{"d": {Source: filepath.Join(dir, "src")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "src", "l")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "t", filepath.Join(dir, "src", "l"))
	asLink, err := provision.Build(provision.Input{Home: map[string]provision.HomeMapping{"d": {Source: filepath.Join(dir, "src")}}})
	if err != nil {
		t.Fatal(err)
	}
	if w, _, _ := provision.Diff(asFile.Hashes(), asLink); !slices.Equal(w, []string{"d/l"}) {
		t.Errorf("file → link: write = %q, want [d/l]", w)
	}
}

func TestOnly(t *testing.T) {
	t.Parallel()
	plan := tarPlan(t)
	sub := plan.Only([]string{".config/opencode/opencode.jsonc"})
	var files, dirs int
	for _, f := range sub.Files {
		if f.Dir {
			dirs++
		} else {
			files++
		}
	}
	if files != 1 || dirs != 3 { // agents, tools, tools/shared
		t.Errorf("Only kept %d files and %d dirs: %v", files, dirs, sub.Files)
	}
	if len(plan.Files) != 8 {
		t.Errorf("Only changed the plan it was called on: %d files", len(plan.Files))
	}
}
