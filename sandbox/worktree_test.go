package sandbox_test

// Tests of worktree sessions (issue 9) against the real engine and real git:
// the host checkout stays untouched across a session that commits, rebases
// and creates files; export brings the exact commits; reattaching continues;
// invalid names and bases; submodules; LFS pointers; a bare checkout; two
// sessions at once; tasks and the CLI. The lc* helpers are lifecycle_test.go's.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/internal/testbin"
	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// wtConfig is the project config of the worktree tests: the shell agent and
// no network (nothing here needs one).
const wtConfig = "agent = \"shell\"\n[network]\nmode = \"none\"\n"

// wtGitEnv makes commits in the VM deterministic and attributable.
var wtGitEnv = map[string]string{
	"GIT_AUTHOR_NAME": "Session", "GIT_AUTHOR_EMAIL": "session@agents-sandbox.invalid",
	"GIT_COMMITTER_NAME": "Session", "GIT_COMMITTER_EMAIL": "session@agents-sandbox.invalid",
}

// wtSh runs a shell script in worktree session spec and returns its
// standard output; a non-zero exit fails the test.
func (e *lcEnv) wtSh(t *testing.T, p *sandbox.Project, spec, script string) string {
	t.Helper()
	res, err := e.m.Exec(lcCtx(t), p, sandbox.ExecOptions{Cmd: []string{"sh", "-c", script}, Worktree: spec, Env: wtGitEnv})
	if err != nil {
		t.Fatalf("Exec --worktree %s %q: %v", spec, script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("Exec --worktree %s %q: exit %d\nstdout: %s\nstderr: %s", spec, script, res.ExitCode, res.Stdout.Text, res.Stderr.Text)
	}
	return res.Stdout.Text
}

// wtSession returns the session called name from Worktrees.
func (e *lcEnv) wtSession(t *testing.T, p *sandbox.Project, name string) sandbox.WorktreeSession {
	t.Helper()
	list, err := e.m.Worktrees(lcCtx(t), p, sandbox.WorktreeListOptions{})
	if err != nil {
		t.Fatalf("Worktrees: %v", err)
	}
	for _, s := range list {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("Worktrees: no session %q in %+v", name, list)
	return sandbox.WorktreeSession{}
}

// wtSnapshot describes every entry under dir, .git included: type and mode
// bits, size, modification time, and the sha256 of a file's content or a
// link's target. Creating, deleting or writing anything changes it (a
// directory's mtime moves when an entry is added or removed).
func wtSnapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%s size=%d mtime=%d", info.Mode(), info.Size(), info.ModTime().UnixNano())
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += " sha256=" + hex.EncodeToString(sum[:])
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return out
}

// wtSameSnapshot fails the test with the differences of two snapshots.
func wtSameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	var diffs []string
	for p, b := range before {
		if a, ok := after[p]; !ok {
			diffs = append(diffs, "gone: "+p)
		} else if a != b {
			diffs = append(diffs, fmt.Sprintf("changed: %s: %s -> %s", p, b, a))
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, "new: "+p+" "+a)
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Errorf("%s changed:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// wtProject makes a checkout with config and two branches that part after
// "project files": main ("main moves on", main.txt) and feature ("feature
// work", feature.txt); main is checked out. It creates the VM and returns
// both.
func (e *lcEnv) wtProject(t *testing.T, name string) (string, *sandbox.Project) {
	t.Helper()
	dir := e.checkout(t, name, wtConfig, map[string]string{"src/app.txt": "one\ntwo\nthree\n"})
	gittest.Git(t, dir, "add", "-A")
	gittest.Git(t, dir, "commit", "-q", "-m", "project files")
	gittest.Git(t, dir, "checkout", "-q", "-b", "feature")
	gittest.Commit(t, dir, "feature.txt", "on feature\n", "feature work")
	gittest.Git(t, dir, "checkout", "-q", "main")
	gittest.Commit(t, dir, "main.txt", "on main\n", "main moves on")
	p := e.open(t, dir, nil)
	e.create(t, p, sandbox.CreateOptions{})
	return dir, p
}

func TestParseWorktreeSpec(t *testing.T) {
	t.Parallel()
	testenv.RequireGit(t)
	for _, tc := range []struct {
		in, name, base string
		bad            string // part of the error; "" for none
	}{
		{in: "fix", name: "fix"},
		{in: "fix-login:main", name: "fix-login", base: "main"},
		{in: "feat/x:HEAD~2", name: "feat/x", base: "HEAD~2"},
		{in: "a:origin/main", name: "a", base: "origin/main"},
		{in: "v1.2", name: "v1.2"},
		{in: "", bad: "the name is empty"},
		{in: ":main", bad: "the name is empty"},
		{in: "a..b", bad: "not a valid git branch name"},
		{in: "a.lock", bad: "not a valid git branch name"},
		{in: "x/", bad: "not a valid git branch name"},
		{in: "a b", bad: "white space"},
		{in: "a~1", bad: "not a valid git branch name"},
		{in: "@{-1}", bad: "@{"},
		{in: "-x", bad: "starts with '-'"},
		{in: strings.Repeat("n", 101), bad: "longer than 100"},
		{in: "fix:", bad: "BASE after the colon is empty"},
		{in: "fix:-rf", bad: "starts with '-'"},
		{in: "fix:a\nb", bad: "control character"},
	} {
		got, err := sandbox.ParseWorktreeSpec(tc.in)
		if tc.bad != "" {
			if err == nil || !errors.Is(err, sandbox.ErrInvalid) || !errors.Is(err, sandbox.ErrBadWorktree) || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("ParseWorktreeSpec(%q) = %+v, %v; want an ErrInvalid/ErrBadWorktree error saying %q", tc.in, got, err, tc.bad)
			}
			continue
		}
		if err != nil || got.Name != tc.name || got.Base != tc.base {
			t.Errorf("ParseWorktreeSpec(%q) = %+v, %v; want name %q base %q", tc.in, got, err, tc.name, tc.base)
		}
		if got.String() != tc.in {
			t.Errorf("ParseWorktreeSpec(%q).String() = %q", tc.in, got.String())
		}
	}
}

// TestWorktreeHostUntouched: a session that commits, rebases onto a host
// branch, creates files, fetches from the host, and runs the agent leaves
// every file of the host checkout and its .git as it was (names, modes,
// sizes, mtimes, content). The VM runs as a dev user whose uid differs from
// the files' owner, so git's ownership check is on the path too.
func TestWorktreeHostUntouched(t *testing.T) {
	t.Parallel()
	start := time.Now()
	e := newLC(t, lcOptions{nonRoot: true})
	dir, p := e.wtProject(t, "untouched")
	mainHead := gittest.Git(t, dir, "rev-parse", "HEAD")
	featureHead := gittest.Git(t, dir, "rev-parse", "feature")
	before := wtSnapshot(t, dir)
	t0 := time.Now()

	out := e.wtSh(t, p, "work", `set -e
pwd
git rev-parse HEAD
git branch --show-current
echo change >> src/app.txt
echo new > new.txt
mkdir -p deep/er && echo x > deep/er/file
git add -A && git commit -q -m "session commit 1"
echo more >> new.txt && git commit -q -am "session commit 2"
git fetch -q host
git rebase -q --onto host/feature host/main
git log --format=%s -n 3
echo untracked > scratch.txt`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || lines[0] != sandbox.WorktreesDir+"/work" || lines[1] != mainHead || lines[2] != "agents-sandbox/work" ||
		lines[3] != "session commit 2" || lines[4] != "session commit 1" || lines[5] != "feature work" {
		t.Errorf("session output:\n%s\nwant the worktree path, %s, the branch and the rebased log", out, mainHead)
	}
	// The agent, in the session (the shell agent's headless command).
	res, err := e.m.Attach(lcCtx(t), p, sandbox.AttachOptions{Headless: true, Args: []string{"pwd; touch agent-file"}, Worktree: "work"})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout.Text) != sandbox.WorktreesDir+"/work" {
		t.Errorf("Attach --worktree work: %+v, %v; want it to run in %s", res, err, sandbox.WorktreesDir+"/work")
	}
	s := e.wtSession(t, p, "work")
	if s.Branch != "agents-sandbox/work" || s.Base != "HEAD" || s.BaseCommit != mainHead || s.BaseRef != "refs/remotes/host/main" ||
		!s.Dirty || s.Missing || s.Ahead != 3 || s.Behind != 1 {
		t.Errorf("session = %+v; want base HEAD at %s following host/main, 3 ahead (feature's commit and the session's) and 1 behind (main's last commit, rebased away), dirty", s, mainHead)
	}
	var diff bytes.Buffer
	if _, err := e.m.WorktreeDiff(lcCtx(t), p, "work", &diff); err != nil {
		t.Fatalf("WorktreeDiff: %v", err)
	}
	for _, want := range []string{"+++ b/new.txt", "+++ b/scratch.txt", "diff --git a/agent-file b/agent-file", "+++ b/deep/er/file", "+change", "+++ b/feature.txt"} {
		if !strings.Contains(diff.String(), want) {
			t.Errorf("diff lacks %q:\n%s", want, diff.String())
		}
	}
	if strings.Contains(diff.String(), "main.txt") {
		t.Errorf("diff shows main.txt, which the session never touched (it rebased away from main):\n%s", diff.String())
	}
	if gittest.Git(t, dir, "rev-parse", "feature") != featureHead {
		t.Error("the host's feature branch moved")
	}
	wtSameSnapshot(t, "the host checkout (with .git)", before, wtSnapshot(t, dir))
	t.Logf("setup (checkout, image, VM) %s; session, agent, diff and checks %s", t0.Sub(start).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

// TestWorktreeExport: export writes agents-sandbox/NAME into the host
// repository with the session's exact commits, touches no other ref and no
// work tree file, refuses a non-fast-forward without Force, and is a no-op
// when the host is current.
func TestWorktreeExport(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	dir, p := e.wtProject(t, "export")
	refsBefore := gittest.Git(t, dir, "for-each-ref", "--format=%(refname) %(objectname)")
	statusBefore := gittest.Git(t, dir, "status", "--porcelain")
	e.wtSh(t, p, "exp:feature", `set -e
printf 'a\n' > a.txt && git add a.txt && git commit -q -m one
printf 'b\n' > b.txt && git add b.txt && git commit -q -m two
chmod +x b.txt && git commit -q -am "mode"`)
	sessionLog := strings.TrimSpace(e.wtSh(t, p, "exp", "git rev-list --parents agents-sandbox/exp"))

	t0 := time.Now()
	res, err := e.m.ExportWorktree(lcCtx(t), p, "exp", sandbox.ExportOptions{})
	if err != nil {
		t.Fatalf("ExportWorktree: %v", err)
	}
	t.Logf("export took %s", time.Since(t0).Round(time.Millisecond))
	if !res.Updated || res.Previous != "" || res.Ref != "refs/heads/agents-sandbox/exp" || res.Uncommitted {
		t.Errorf("ExportWorktree = %+v", res)
	}
	if got := gittest.Git(t, dir, "rev-list", "--parents", "agents-sandbox/exp"); got != sessionLog {
		t.Errorf("host agents-sandbox/exp history:\n%s\nwant the session's:\n%s", got, sessionLog)
	}
	if res.Commit != strings.Fields(sessionLog)[0] {
		t.Errorf("export commit %s, want %s", res.Commit, strings.Fields(sessionLog)[0])
	}
	var kept []string
	for _, l := range strings.Split(gittest.Git(t, dir, "for-each-ref", "--format=%(refname) %(objectname)"), "\n") {
		if !strings.HasPrefix(l, "refs/heads/agents-sandbox/exp ") {
			kept = append(kept, l)
		}
	}
	if refsAfter := strings.Join(kept, "\n"); refsAfter != refsBefore {
		t.Errorf("other refs changed:\n%s\nwant\n%s", refsAfter, refsBefore)
	}
	if st := gittest.Git(t, dir, "status", "--porcelain"); st != statusBefore {
		t.Errorf("host status %q after export, want %q", st, statusBefore)
	}
	if _, err := os.Stat(filepath.Join(dir, ".git", "FETCH_HEAD")); err == nil {
		t.Error("export left FETCH_HEAD in the host's .git")
	}

	// Nothing new: no-op.
	res, err = e.m.ExportWorktree(lcCtx(t), p, "exp", sandbox.ExportOptions{})
	if err != nil || res.Updated || res.Commit != res.Previous {
		t.Errorf("second ExportWorktree = %+v, %v; want no update", res, err)
	}

	// Rewritten history: a conflict without Force, replaced with it.
	e.wtSh(t, p, "exp", `git commit -q --amend -m "mode, amended" && echo dirty > d.txt`)
	if _, err := e.m.ExportWorktree(lcCtx(t), p, "exp", sandbox.ExportOptions{}); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("export after amend: %v, want ErrConflict mentioning --force", err)
	}
	res, err = e.m.ExportWorktree(lcCtx(t), p, "exp", sandbox.ExportOptions{Force: true})
	if err != nil || !res.Updated || !res.Uncommitted {
		t.Fatalf("export --force: %+v, %v; want updated, uncommitted changes flagged", res, err)
	}
	if got, want := gittest.Git(t, dir, "log", "-1", "--format=%s", "agents-sandbox/exp"), "mode, amended"; got != want {
		t.Errorf("host branch tip %q, want %q", got, want)
	}

	// A fresh session whose branch adds nothing the host lacks exports too.
	e.wtSh(t, p, "same:main", "true")
	res, err = e.m.ExportWorktree(lcCtx(t), p, "same", sandbox.ExportOptions{})
	if err != nil || res.Commit != gittest.Git(t, dir, "rev-parse", "main") || gittest.Git(t, dir, "rev-parse", "agents-sandbox/same") != res.Commit {
		t.Errorf("export of an unchanged session: %+v, %v", res, err)
	}

	// A branch checked out on the host is refused.
	gittest.Git(t, dir, "checkout", "-q", "agents-sandbox/same")
	e.wtSh(t, p, "same", "git commit -q --allow-empty -m more")
	if _, err := e.m.ExportWorktree(lcCtx(t), p, "same", sandbox.ExportOptions{}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("export into the checked-out branch: %v, want ErrConflict", err)
	}
	gittest.Git(t, dir, "checkout", "-q", "main")

	// rm keeps a session with unexported commits unless forced, and never
	// touches the host's branch.
	if err := e.m.RemoveWorktree(lcCtx(t), p, "same", sandbox.RemoveWorktreeOptions{}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("rm of a session with an unexported commit: %v, want ErrConflict", err)
	}
	if err := e.m.RemoveWorktree(lcCtx(t), p, "same", sandbox.RemoveWorktreeOptions{Force: true}); err != nil {
		t.Errorf("rm --force: %v", err)
	}
	if err := e.m.RemoveWorktree(lcCtx(t), p, "exp", sandbox.RemoveWorktreeOptions{}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("rm of a dirty session: %v, want ErrConflict", err)
	}
	e.wtSh(t, p, "exp", "rm d.txt")
	if err := e.m.RemoveWorktree(lcCtx(t), p, "exp", sandbox.RemoveWorktreeOptions{}); err != nil {
		t.Errorf("rm of an exported, clean session: %v", err)
	}
	list, err := e.m.Worktrees(lcCtx(t), p, sandbox.WorktreeListOptions{})
	if err != nil || len(list) != 0 {
		t.Errorf("Worktrees after rm: %+v, %v; want none", list, err)
	}
	if gittest.Git(t, dir, "rev-parse", "agents-sandbox/same") == "" {
		t.Error("rm removed the host's exported branch")
	}
	if err := e.m.RemoveWorktree(lcCtx(t), p, "exp", sandbox.RemoveWorktreeOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("rm of a removed session: %v, want ErrNotFound", err)
	}
}

// TestWorktreeReattach: the same NAME continues the session (its commits,
// uncommitted and untracked files); another BASE is a conflict; a deleted
// worktree directory is checked out again from its branch; the session
// survives a VM restart.
func TestWorktreeReattach(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	_, p := e.wtProject(t, "reattach")
	e.wtSh(t, p, "r:feature", `set -e; echo 1 > committed.txt; git add committed.txt; git commit -q -m c1; echo wip >> src/app.txt; echo u > untracked.txt`)
	for _, spec := range []string{"r", "r:feature"} {
		out := e.wtSh(t, p, spec, `git log --format=%s -1; git status --porcelain; cat untracked.txt`)
		if want := "c1\n M src/app.txt\n?? untracked.txt\nu\n"; out != want {
			t.Errorf("reattach with %q: %q, want %q", spec, out, want)
		}
	}
	_, err := e.m.Exec(lcCtx(t), p, sandbox.ExecOptions{Cmd: []string{"true"}, Worktree: "r:main"})
	if !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "started from feature") {
		t.Errorf("reattach with another BASE: %v, want ErrConflict naming the session's base", err)
	}

	// The VM restarts: the session lives on the home volume.
	if _, err := e.m.Stop(lcCtx(t), p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if list, err := e.m.Worktrees(lcCtx(t), p, sandbox.WorktreeListOptions{NoStart: true}); err != nil || list != nil {
		t.Errorf("Worktrees(NoStart) of a stopped VM: %+v, %v; want nothing, no error", list, err)
	}
	if out := e.wtSh(t, p, "r", "cat untracked.txt"); out != "u\n" {
		t.Errorf("after a restart the session has untracked.txt = %q", out)
	}

	// The worktree directory is removed behind git's back.
	e.sh(t, p, "rm -rf "+sandbox.WorktreesDir+"/r")
	if s := e.wtSession(t, p, "r"); !s.Missing {
		t.Errorf("session with its directory gone: %+v, want missing", s)
	}
	if out := e.wtSh(t, p, "r", "git log --format=%s -1; git status --porcelain; test -f committed.txt && echo has-c1"); out != "c1\nhas-c1\n" {
		t.Errorf("session checked out again: %q, want its branch at c1, clean (the uncommitted work went with the directory)", out)
	}
}

// TestWorktreeInvalid: an invalid NAME or a BASE that does not exist is
// ErrInvalid with ErrBadWorktree naming the input and the fix, before
// anything is made in the VM.
func TestWorktreeInvalid(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	_, p := e.wtProject(t, "invalid")
	for _, tc := range []struct{ spec, want string }{
		{"bad..name", "not a valid git branch name"},
		{"ok:no-such-branch", `BASE "no-such-branch": no such branch, tag or commit`},
		{"ok:0123456789abcdef0123456789abcdef01234567", "no such branch, tag or commit"},
		{"ok:README.md", "no such branch, tag or commit"},
		{"x:", "BASE after the colon is empty"},
	} {
		_, err := e.m.Exec(lcCtx(t), p, sandbox.ExecOptions{Cmd: []string{"true"}, Worktree: tc.spec})
		if !errors.Is(err, sandbox.ErrInvalid) || !errors.Is(err, sandbox.ErrBadWorktree) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--worktree %q: %v; want ErrInvalid/ErrBadWorktree saying %q", tc.spec, err, tc.want)
		}
	}
	if list, err := e.m.Worktrees(lcCtx(t), p, sandbox.WorktreeListOptions{}); err != nil || len(list) != 0 {
		t.Errorf("after invalid specs: sessions %+v, %v; want none", list, err)
	}
	if _, err := e.m.WorktreeDiff(lcCtx(t), p, "nope", &bytes.Buffer{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("diff of no session: %v, want ErrNotFound", err)
	}
	if _, err := e.m.ExportWorktree(lcCtx(t), p, "nope", sandbox.ExportOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("export of no session: %v, want ErrNotFound", err)
	}

	// A checkout without commits has no HEAD to start from.
	empty := filepath.Join(e.root, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	gittest.Git(t, empty, "init", "-q", "-b", "main")
	lcWrite(t, filepath.Join(empty, ".agents-sandbox", "config.toml"), wtConfig, 0o644)
	pe := e.open(t, empty, nil)
	e.create(t, pe, sandbox.CreateOptions{})
	_, err := e.m.Exec(lcCtx(t), pe, sandbox.ExecOptions{Cmd: []string{"true"}, Worktree: "first"})
	if !errors.Is(err, sandbox.ErrBadWorktree) || !strings.Contains(err.Error(), "no commits yet") {
		t.Errorf("--worktree in a checkout without commits: %v; want ErrBadWorktree saying there are no commits", err)
	}

	// A directory outside any checkout has no worktrees.
	plain := filepath.Join(e.root, "plain")
	lcWrite(t, filepath.Join(plain, ".agents-sandbox", "config.toml"), wtConfig, 0o644)
	pp := e.open(t, plain, nil)
	e.create(t, pp, sandbox.CreateOptions{})
	if _, err := e.m.Exec(lcCtx(t), pp, sandbox.ExecOptions{Cmd: []string{"true"}, Worktree: "x"}); !errors.Is(err, sandbox.ErrNotCheckout) {
		t.Errorf("--worktree outside a checkout: %v, want ErrNotCheckout", err)
	}
}

// TestWorktreeSubmoduleAndLFS: a new session checks out the submodule from
// the host's submodule repository (read-only, no network), leaves a
// submodule the host never checked out uninitialised with a warning, and
// keeps an LFS pointer a pointer even with an LFS filter configured in the
// VM; the host stays untouched.
func TestWorktreeSubmoduleAndLFS(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	sub := gittest.Init(t, filepath.Join(e.root, "sub-src"))
	subHead := gittest.Commit(t, sub, "lib.txt", "library\n", "lib")
	other := gittest.Init(t, filepath.Join(e.root, "other-src"))
	dir := e.checkout(t, "super", wtConfig, map[string]string{
		".gitattributes": "*.bin filter=lfs diff=lfs merge=lfs -text\n",
		"big.bin":        "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n",
	})
	gittest.Git(t, dir, "add", "-A")
	gittest.Git(t, dir, "commit", "-q", "-m", "lfs pointer")
	gittest.Git(t, dir, "-c", "protocol.file.allow=always", "submodule", "add", "-q", sub, "libs/sub")
	gittest.Git(t, dir, "-c", "protocol.file.allow=always", "submodule", "add", "-q", other, "libs/other")
	gittest.Git(t, dir, "commit", "-q", "-m", "submodules")
	// libs/other is not checked out on the host: its repository is gone.
	gittest.Git(t, dir, "submodule", "deinit", "-q", "-f", "libs/other")
	if err := os.RemoveAll(filepath.Join(dir, ".git", "modules", "libs", "other")); err != nil {
		t.Fatal(err)
	}
	// The sources are moved away: nothing may be fetched from them.
	for _, d := range []string{sub, other} {
		if err := os.Rename(d, d+"-gone"); err != nil {
			t.Fatal(err)
		}
	}
	p := e.open(t, dir, nil)
	e.create(t, p, sandbox.CreateOptions{})
	// An LFS filter in the VM user's configuration, as git-lfs installs it,
	// that would replace the pointer if it ran.
	e.sh(t, p, `git config --global filter.lfs.smudge "sh -c 'echo SMUDGED'" && git config --global filter.lfs.process "" && git config --global filter.lfs.required true`)
	before := wtSnapshot(t, dir)

	s, err := e.m.OpenWorktree(lcCtx(t), p, sandbox.WorktreeSpec{Name: "mods"})
	if err != nil {
		t.Fatalf("OpenWorktree: %v", err)
	}
	if !s.Created || len(s.Warnings) != 1 || !strings.Contains(s.Warnings[0], "libs/other is not checked out on the host") {
		t.Errorf("OpenWorktree = %+v; want created, one warning about libs/other", s)
	}
	out := e.wtSh(t, p, "mods", `set -e
cat libs/sub/lib.txt
git -C libs/sub rev-parse HEAD
ls -A libs/other | wc -l
cat big.bin
git status --porcelain
echo changed > libs/sub/lib.txt`)
	want := "library\n" + subHead + "\n0\nversion https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"
	if out != want {
		t.Errorf("session sees:\n%s\nwant:\n%s", out, want)
	}
	if s := e.wtSession(t, p, "mods"); !s.Dirty {
		t.Errorf("a changed submodule leaves the session clean: %+v", s)
	}
	wtSameSnapshot(t, "the host checkout (with .git and its submodule repositories)", before, wtSnapshot(t, dir))
}

// TestWorktreeBareCheckout: from a linked worktree of a bare checkout
// (project/.git bare), a session starts at that worktree's HEAD and exports
// into the bare repository; nothing else of the project changes.
func TestWorktreeBareCheckout(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	src := e.checkout(t, "bare-src", wtConfig, nil)
	gittest.Git(t, src, "add", "-A")
	gittest.Git(t, src, "commit", "-q", "-m", "config")
	project := gittest.BareWithWorktrees(t, src, filepath.Join(e.root, "bareproj"), "wt1", "wt2")
	// A bare checkout's configuration lives in the project directory.
	lcWrite(t, filepath.Join(project, ".agents-sandbox", "config.toml"), wtConfig, 0o644)
	gittest.Commit(t, filepath.Join(project, "wt1"), "only-in-wt1.txt", "wt1\n", "wt1 work")
	lcWrite(t, filepath.Join(project, "wt1", "sub", "keep"), "", 0o644)
	gittest.Git(t, filepath.Join(project, "wt1"), "add", "-A")
	wt1Head := gittest.Commit(t, filepath.Join(project, "wt1"), "sub/file", "f\n", "sub dir")
	p := e.open(t, filepath.Join(project, "wt1", "sub"), nil)
	if !p.ID.Bare || p.ID.ProjectDir != project {
		t.Fatalf("identity %+v: want a bare checkout at %s", p.ID, project)
	}
	e.create(t, p, sandbox.CreateOptions{})
	before := wtSnapshot(t, project)

	out := e.wtSh(t, p, "b", "pwd; git rev-parse HEAD; git commit -q --allow-empty -m from-session; git rev-parse HEAD")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != sandbox.WorktreesDir+"/b/sub" || lines[1] != wt1Head {
		t.Fatalf("session from wt1/sub: %q; want it in the worktree's sub/ at wt1's HEAD %s", out, wt1Head)
	}
	s := e.wtSession(t, p, "b")
	if s.BaseRef != "refs/remotes/host/wt1" || s.Ahead != 1 || s.Behind != 0 {
		t.Errorf("session %+v: want base following host/wt1, 1 ahead", s)
	}
	wtSameSnapshot(t, "the bare checkout", before, wtSnapshot(t, project))

	res, err := e.m.ExportWorktree(lcCtx(t), p, "b", sandbox.ExportOptions{})
	if err != nil || !res.Updated {
		t.Fatalf("ExportWorktree: %+v, %v", res, err)
	}
	if got := gittest.Git(t, filepath.Join(project, ".git"), "rev-parse", "agents-sandbox/b"); got != lines[2] {
		t.Errorf("bare repository's agents-sandbox/b = %s, want %s", got, lines[2])
	}

	// From the project directory itself, HEAD is the bare repository's.
	pRoot := e.open(t, project, nil)
	out = e.wtSh(t, pRoot, "root", "pwd; git rev-parse HEAD")
	if want := sandbox.WorktreesDir + "/root\n" + gittest.Git(t, src, "rev-parse", "HEAD") + "\n"; out != want {
		t.Errorf("session from the bare project's root: %q, want %q", out, want)
	}
}

// TestWorktreeParallel: two sessions of one checkout, opened and committed
// to at the same time, each get their own branch and commits.
func TestWorktreeParallel(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	dir, p := e.wtProject(t, "parallel")
	before := wtSnapshot(t, dir)
	names := []string{"left", "right"}
	outs := make([]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf(`set -e; for i in 1 2 3 4 5; do echo "%s $i" >> %s.txt; git add %s.txt; git commit -q -m "%s $i"; done; git log --format=%%s -n 5 | tr '\n' ,`, n, n, n, n)
			res, err := e.m.Exec(lcCtx(t), p, sandbox.ExecOptions{Cmd: []string{"sh", "-c", script}, Worktree: n, Env: wtGitEnv})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr.Text)
			}
			outs[i], errs[i] = res.Stdout.Text, err
		}()
	}
	wg.Wait()
	t.Logf("two sessions opened and committed to in parallel in %s", time.Since(t0).Round(time.Millisecond))
	for i, n := range names {
		if errs[i] != nil {
			t.Fatalf("session %s: %v", n, errs[i])
		}
		if want := fmt.Sprintf("%s 5,%s 4,%s 3,%s 2,%s 1,", n, n, n, n, n); outs[i] != want {
			t.Errorf("session %s log %q, want %q", n, outs[i], want)
		}
	}
	list, err := e.m.Worktrees(lcCtx(t), p, sandbox.WorktreeListOptions{Refresh: true})
	if err != nil || len(list) != 2 || list[0].Name != "left" || list[1].Name != "right" || list[0].Ahead != 5 || list[1].Ahead != 5 || list[0].Dirty || list[1].Dirty {
		t.Errorf("Worktrees = %+v, %v; want left and right, 5 ahead each, clean", list, err)
	}
	wtSameSnapshot(t, "the host checkout", before, wtSnapshot(t, dir))
}

// TestWorktreeTask: a task with a worktree works in the session on the
// project VM's home volume; the VM then sees its commit.
func TestWorktreeTask(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	dir, p := e.wtProject(t, "wttask")
	before := wtSnapshot(t, dir)
	if _, err := e.m.SpawnTask(lcCtx(t), p, sandbox.TaskOptions{Cmd: []string{"true"}, Worktree: "t", Workspace: sandbox.WorkspaceCopy}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("task with worktree and workspace copy: %v, want ErrInvalid", err)
	}
	t0 := time.Now()
	res, err := e.m.SpawnTask(lcCtx(t), p, sandbox.TaskOptions{
		Cmd:      []string{"sh", "-c", "pwd; echo task > task.txt; git add task.txt; git commit -q -m from-task"},
		Worktree: "t:feature", Env: wtGitEnv,
	})
	if err != nil {
		t.Fatalf("SpawnTask --worktree: %v", err)
	}
	t.Logf("worktree task took %s", time.Since(t0).Round(time.Millisecond))
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout.Text) != sandbox.WorktreesDir+"/t" || res.Worktree == nil ||
		res.Worktree.Ahead != 1 || res.Worktree.Base != "feature" || res.Workspace != string(sandbox.WorkspaceNone) {
		t.Errorf("task result %+v (worktree %+v)", res, res.Worktree)
	}
	if out := e.wtSh(t, p, "t", "git log --format=%s -1; cat task.txt"); out != "from-task\ntask\n" {
		t.Errorf("the VM's session after the task: %q", out)
	}
	wtSameSnapshot(t, "the host checkout", before, wtSnapshot(t, dir))
}

// TestWorktreeCLI drives the binary: exec --worktree, worktree ls --json,
// diff, export, rm, and the exit code of an invalid name.
func TestWorktreeCLI(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	dir, p := e.wtProject(t, "wtcli")
	bin := testbin.Path(t)
	cli := func(args ...string) (string, string, int) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{
			"HOME=" + e.hostHome, "PATH=" + os.Getenv("PATH"),
			"XDG_CONFIG_HOME=" + e.xdg.config, "XDG_STATE_HOME=" + e.xdg.state, "XDG_CACHE_HOME=" + e.xdg.cache,
			"GIT_AUTHOR_NAME=cli", "GIT_AUTHOR_EMAIL=cli@agents-sandbox.invalid", "GIT_COMMITTER_NAME=cli", "GIT_COMMITTER_EMAIL=cli@agents-sandbox.invalid",
		}
		if h := os.Getenv("DOCKER_HOST"); h != "" {
			cmd.Env = append(cmd.Env, "DOCKER_HOST="+h)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return stdout.String(), stderr.String(), code
	}
	script := `printf 'x\n' > cli.txt && git add cli.txt && git -c user.name=cli -c user.email=cli@agents-sandbox.invalid commit -q -m cli && pwd`
	if out, errOut, code := cli("exec", "--worktree", "c:feature", "--", "sh", "-c", script); code != 0 || out != sandbox.WorktreesDir+"/c\n" {
		t.Fatalf("exec --worktree: %q %q exit %d", out, errOut, code)
	}
	out, errOut, code := cli("worktree", "ls", "--json")
	var list []sandbox.WorktreeSession
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Name != "c" || list[0].Ahead != 1 || list[0].Base != "feature" {
		t.Errorf("worktree ls --json: %q %q exit %d", out, errOut, code)
	}
	if out, _, code := cli("worktree", "ls"); code != 0 || !strings.Contains(out, "agents-sandbox/c") || !strings.Contains(out, "clean") {
		t.Errorf("worktree ls: %q exit %d", out, code)
	}
	if out, _, code := cli("worktree", "diff", "c"); code != 0 || !strings.Contains(out, "+++ b/cli.txt") {
		t.Errorf("worktree diff: %q exit %d", out, code)
	} else {
		// The diff applies to BASE.
		check := gittest.Clone(t, dir, filepath.Join(e.root, "apply-check"))
		gittest.Git(t, check, "checkout", "-q", "feature")
		cmd := exec.Command("git", "-C", check, "apply", "--check", "-")
		cmd.Stdin = strings.NewReader(out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("git apply --check of the diff on feature: %v: %s", err, b)
		}
	}
	// The session's commit exists only in the VM: rm --volume refuses.
	if _, errOut, code := cli("rm", "--volume", "--yes"); code == 0 || !strings.Contains(errOut, "c (1 commits not exported)") || !strings.Contains(errOut, "--discard-worktrees") {
		t.Errorf("rm --volume with unexported work: exit %d, stderr %q", code, errOut)
	}
	if out, errOut, code := cli("worktree", "export", "c"); code != 0 || !strings.Contains(out, "agents-sandbox/c") {
		t.Errorf("worktree export: %q %q exit %d", out, errOut, code)
	}
	if got := gittest.Git(t, dir, "log", "-1", "--format=%s", "agents-sandbox/c"); got != "cli" {
		t.Errorf("host agents-sandbox/c tip %q, want cli", got)
	}
	if _, errOut, code := cli("exec", "--worktree", "bad..name", "--", "true"); code != 2 || !strings.Contains(errOut, "not a valid git branch name") {
		t.Errorf("exec --worktree bad..name: %q exit %d, want exit 2", errOut, code)
	}
	if out, errOut, code := cli("worktree", "rm", "c"); code != 0 || !strings.Contains(out, "removed") {
		t.Errorf("worktree rm: %q %q exit %d", out, errOut, code)
	}
	_ = p
}
