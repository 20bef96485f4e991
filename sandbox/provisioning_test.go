package sandbox_test

// End-to-end provisioning (issue 5) into a real VM, checked from inside it:
// the agent config merged from three snippet layers, [home] mappings of
// files and directories, startup hooks, stale removal, shadowed configs and
// path escapes. The VM runs as dev with uid 1000, as for a non-root host
// user. Helpers are in lifecycle_test.go.

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// lcProvisionConfig: an agent reading a JSONC config where opencode does
// (so opencode.json next to it would shadow the merged file), and [home]
// mappings of every source kind.
const lcProvisionConfig = `agent = "testp"
[network]
mode = "open"
[agents.testp]
config = ".config/opencode/opencode.jsonc"
attach = ["bash", "-l"]
headless = ["bash", "-lc"]
[home]
".gitconfig" = "~/.gitconfig"
"tools" = "~/tools"
"same.txt" = ""
"rel.txt" = "rel-source.txt"
"bin/setup.sh" = { source = "~/setup.sh", hook = "startup" }
"bin/root.sh" = { source = "~/root.sh", hook = "startup", root = true }
"maybe.txt" = { source = "~/does-not-exist", optional = true }
`

func TestProvision(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{nonRoot: true})
	h := func(p string) string { return filepath.Join(e.hostHome, filepath.FromSlash(p)) }
	lcWrite(t, h(".gitconfig"), "[user]\n\tname = test\n", 0o644)
	lcWrite(t, h("tools/run.sh"), "#!/bin/sh\necho run\n", 0o755)
	lcWrite(t, h("tools/data/secret.txt"), "s3cret\n", 0o600)
	lcWrite(t, h("same.txt"), "same\n", 0o640)
	lcWrite(t, h("setup.sh"), "#!/bin/sh\necho \"setup ran as $(id -un) in $PWD\"\necho run >> \"$HOME/setup.count\"\n", 0o755)
	lcWrite(t, h("root.sh"), "#!/bin/sh\necho \"root hook ran as $(id -un)\"\ntouch /etc/root-hook-ran\n", 0o700)
	for link, target := range map[string]string{
		"tools/link": "run.sh",        // inside the source: copied as a link
		"tools/out":  "../.gitconfig", // out of the source: skipped
		"tools/abs":  "/etc/passwd",   // absolute: skipped
	} {
		if err := os.Symlink(target, h(link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(h("tools"), 0o750); err != nil {
		t.Fatal(err)
	}
	dir := e.checkout(t, "prov", lcProvisionConfig, map[string]string{
		".agents-sandbox/rel-source.txt":             "relative\n",
		".agents-sandbox/testp/30-project.json":      `{"project": true, "obj": {"p": 1}}`,
		".agents-sandbox/testp/extra/notes.txt":      "notes\n",
		".agents-sandbox/testp/extra/tool.sh":        "#!/bin/sh\n",
		".agents-sandbox/testp/opencode.json.sample": "{}",
	})
	if err := os.Chmod(filepath.Join(dir, ".agents-sandbox/testp/extra/tool.sh"), 0o751); err != nil {
		t.Fatal(err)
	}
	p := e.open(t, dir, nil)
	// The user and per-repo layers.
	lcWrite(t, filepath.Join(e.m.Dirs.Config, "testp", "10-user.json"), `{"user": 1, "obj": {"u": 1, "gone": 2}, "arr": [1, 2], "over": "user"}`, 0o644)
	lcWrite(t, filepath.Join(e.m.Dirs.Config, p.ID.RepoSlug, "testp", "20-repo.jsonc"), `{
		// comments and trailing commas are fine
		"obj": {"gone": null, "r": [3]},
		"arr": [3],
		"over": "repo",
	}`, 0o600)

	var progressMu sync.Mutex
	var progress []string
	res := e.create(t, p, sandbox.CreateOptions{Progress: func(line string) {
		progressMu.Lock()
		progress = append(progress, line)
		progressMu.Unlock()
	}})
	if res.User != "dev" {
		t.Errorf("VM user %q, want dev", res.User)
	}
	pr := res.Provision
	if pr == nil {
		t.Fatal("Create did not provision")
	}
	if pr.Config != ".config/opencode/opencode.jsonc" {
		t.Errorf("merged config %q", pr.Config)
	}
	progressMu.Lock()
	joined := strings.Join(progress, "\n")
	progressMu.Unlock()
	for _, want := range []string{"setup ran as dev in /workspace", "root hook ran as root"} {
		if !strings.Contains(joined, want) {
			t.Errorf("hook output %q not in the progress:\n%s", want, joined)
		}
	}
	if len(pr.Hooks) != 2 || pr.Hooks[0].ExitCode != 0 || pr.Hooks[1].ExitCode != 0 {
		t.Errorf("hooks: %+v", pr.Hooks)
	}
	var warned bool
	for _, w := range pr.Warnings {
		if strings.Contains(w, "tools/out") || strings.Contains(w, "out") && strings.Contains(w, "outside") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning about the link out of ~/tools in %q", pr.Warnings)
	}

	// The merged config, from inside the VM.
	var merged map[string]any
	if err := json.Unmarshal([]byte(e.sh(t, p, "cat ~/.config/opencode/opencode.jsonc")), &merged); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"user": 1.0, "project": true, "over": "repo", "arr": []any{3.0},
		"obj": map[string]any{"u": 1.0, "r": []any{3.0}, "p": 1.0},
	}
	if !reflect.DeepEqual(merged, want) {
		t.Errorf("merged config in the VM:\n%v\nwant:\n%v", merged, want)
	}

	// Owners and modes of everything provisioned, from inside the VM.
	got := e.sh(t, p, `cd ~ && stat -c '%n %U:%G %a %F' .config/opencode .config/opencode/opencode.jsonc \
		.config/opencode/extra/notes.txt .config/opencode/extra/tool.sh .config/opencode/opencode.json.sample \
		.gitconfig tools tools/run.sh tools/data tools/data/secret.txt tools/link same.txt rel.txt bin/setup.sh bin/root.sh \
		&& readlink tools/link && cat rel.txt same.txt tools/data/secret.txt && ls -A tools && cat setup.count && ls /etc/root-hook-ran`)
	wantStat := []string{
		".config/opencode dev:dev 755 directory",
		".config/opencode/opencode.jsonc dev:dev 644 regular file",
		".config/opencode/extra/notes.txt dev:dev 644 regular file",
		".config/opencode/extra/tool.sh dev:dev 751 regular file",
		".config/opencode/opencode.json.sample dev:dev 644 regular file",
		".gitconfig dev:dev 644 regular file",
		"tools dev:dev 750 directory",
		"tools/run.sh dev:dev 755 regular file",
		"tools/data dev:dev 755 directory",
		"tools/data/secret.txt dev:dev 600 regular file",
		"tools/link dev:dev 777 symbolic link",
		"same.txt dev:dev 640 regular file",
		"rel.txt dev:dev 644 regular file",
		"bin/setup.sh dev:dev 755 regular file",
		"bin/root.sh dev:dev 700 regular file",
		"run.sh",
		"relative", "same", "s3cret",
		"data", "link", "run.sh",
		"run",
		"/etc/root-hook-ran",
	}
	if got != strings.Join(wantStat, "\n")+"\n" {
		t.Errorf("in the VM:\n%s\nwant:\n%s", got, strings.Join(wantStat, "\n"))
	}
	e.sh(t, p, "test ! -e ~/maybe.txt")

	// Idempotent: nothing is rewritten, no hook runs on a running VM.
	again, err := e.m.Provision(lcCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Written) != 0 || len(again.Removed) != 0 || len(again.Unchanged) == 0 || len(again.Hooks) != 0 {
		t.Errorf("second Provision: written %v, removed %v, %d unchanged, hooks %v; want only unchanged", again.Written, again.Removed, len(again.Unchanged), again.Hooks)
	}
	for _, f := range again.Unchanged {
		if f.Sha256 == "" || f.Size < 0 {
			t.Errorf("unchanged %+v: no hash or size", f)
		}
	}

	// The agent's own files, a shadowing config, then sources go away.
	e.sh(t, p, `echo mine > ~/.config/opencode/agent-made.txt && echo mine > ~/tools/agent-made.txt &&
		echo '{"shadow": true}' > ~/.config/opencode/opencode.json`)
	for _, f := range []string{filepath.Join(dir, ".agents-sandbox/testp/extra/notes.txt"), h("tools/data/secret.txt")} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	lcWrite(t, filepath.Join(dir, ".agents-sandbox/testp/30-project.json"), `{"project": "changed"}`, 0o644)
	cfg := strings.Replace(lcProvisionConfig, "\"same.txt\" = \"\"\n", "", 1)
	lcWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), cfg, 0o644)
	p = e.open(t, dir, nil)
	third, err := e.m.Provision(lcCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	wantRemoved := []string{".config/opencode/extra/notes.txt", ".config/opencode/opencode.json", "same.txt", "tools/data/secret.txt"}
	var written []string
	for _, f := range third.Written {
		written = append(written, f.Path)
	}
	if !slices.Equal(third.Removed, wantRemoved) || !slices.Equal(written, []string{".config/opencode/opencode.jsonc"}) {
		t.Errorf("Provision after changes: removed %q, written %q; want removed %q, written only the merged config", third.Removed, written, wantRemoved)
	}
	got = e.sh(t, p, `cd ~ && for f in .config/opencode/extra/notes.txt tools/data/secret.txt same.txt .config/opencode/opencode.json; do
		test -e "$f" && echo "still there: $f"; done; cat .config/opencode/agent-made.txt tools/agent-made.txt; grep -c changed .config/opencode/opencode.jsonc`)
	if got != "mine\nmine\n1\n" {
		t.Errorf("after re-provisioning:\n%s\nwant the stale files gone, the agent's kept, the config changed", got)
	}

	// The agent swaps a provisioned directory for a link into the host's
	// checkout; the stale file's removal (as root) does not follow it.
	lcWrite(t, filepath.Join(dir, "victim", "tool.sh"), "host file\n", 0o644)
	e.sh(t, p, `rm -rf ~/.config/opencode/extra && ln -s /workspace/victim ~/.config/opencode/extra`)
	if err := os.Remove(filepath.Join(dir, ".agents-sandbox/testp/extra/tool.sh")); err != nil {
		t.Fatal(err)
	}
	fourth, err := e.m.Provision(lcCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "victim", "tool.sh")); err != nil || string(b) != "host file\n" || slices.Contains(fourth.Removed, ".config/opencode/extra/tool.sh") {
		t.Errorf("stale removal through a link the agent made: host file %q (%v), removed %q", b, err, fourth.Removed)
	}
	// Writing into that directory again replaces the link (the engine would
	// refuse to extract a directory over it) and writes nothing through it.
	lcWrite(t, filepath.Join(dir, ".agents-sandbox/testp/extra/new.txt"), "new\n", 0o644)
	fifth, err := e.m.Provision(lcCtx(t), p)
	if err != nil {
		t.Fatalf("Provision over a linked directory: %v", err)
	}
	if !slices.ContainsFunc(fifth.Warnings, func(w string) bool {
		return strings.Contains(w, ".config/opencode/extra was a link to /workspace/victim")
	}) {
		t.Errorf("no warning about the replaced link in %q", fifth.Warnings)
	}
	if got := e.sh(t, p, `test -d ~/.config/opencode/extra && test ! -L ~/.config/opencode/extra && cat ~/.config/opencode/extra/new.txt`); got != "new\n" {
		t.Errorf("extra/new.txt in the VM: %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "victim", "new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("provisioning wrote through the agent's link into the checkout: %v", err)
	}

	// Path escapes are rejected, and nothing of that configuration is
	// written. Targets that leave /home/dev fail when the config loads.
	for _, bad := range []string{`"../escape.txt" = "~/.gitconfig"`, `"/etc/escape.txt" = "~/.gitconfig"`, `"a/../../escape.txt" = "~/.gitconfig"`} {
		lcWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), cfg+"\"new.txt\" = \"~/.gitconfig\"\n"+bad+"\n", 0o644)
		_, err := e.m.Open(sandbox.OpenOptions{Dir: dir, Trust: true})
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("config with %s: Open gave %v, want ErrInvalid", bad, err)
		}
	}
	// A target on the merged config fails at provisioning, before anything
	// is written.
	lcWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), cfg+"\"new.txt\" = \"~/.gitconfig\"\n\".config/opencode/opencode.jsonc\" = \"~/.gitconfig\"\n", 0o644)
	lcWrite(t, filepath.Join(dir, ".agents-sandbox/testp/30-project.json"), `{"project": "not written"}`, 0o644)
	bad := e.open(t, dir, nil)
	if _, err := e.m.Provision(lcCtx(t), bad); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "opencode.jsonc") {
		t.Errorf("mapping onto the merged config: %v, want ErrInvalid naming it", err)
	}
	if got := e.sh(t, p, `cd ~ && test ! -e new.txt && grep -c changed .config/opencode/opencode.jsonc`); got != "1\n" {
		t.Errorf("after the refused provisioning: %q", got)
	}

	// A failing startup hook fails Create with its output.
	lcWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), cfg, 0o644)
	lcWrite(t, filepath.Join(dir, ".agents-sandbox/testp/30-project.json"), `{"project": "changed"}`, 0o644)
	lcWrite(t, h("setup.sh"), "#!/bin/sh\necho 'about to fail'\nprintf 'hook failing loudly' >&2 # no newline\nexit 3\n", 0o755)
	p = e.open(t, dir, nil)
	if _, err := e.m.Stop(lcCtx(t), p, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var hookOut bytes.Buffer
	_, err = e.m.Create(lcCtx(t), p, sandbox.CreateOptions{Progress: func(l string) { hookOut.WriteString(l + "\n") }})
	if err == nil || !strings.Contains(err.Error(), "hook failing loudly") || !strings.Contains(err.Error(), "about to fail") || !strings.Contains(err.Error(), "exit code 3") {
		t.Errorf("Create with a failing hook: %v; want an error with the hook's output and exit code", err)
	}
	if !strings.Contains(hookOut.String(), "hook failing loudly") {
		t.Errorf("the failing hook's output did not reach the caller's progress: %q", hookOut.String())
	}
}
