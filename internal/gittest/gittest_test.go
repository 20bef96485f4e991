package gittest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
)

func TestInitIsDeterministic(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	a := gittest.Init(t, filepath.Join(root, "a"))
	b := gittest.Init(t, filepath.Join(root, "b"))
	ha := gittest.Git(t, a, "rev-parse", "HEAD")
	hb := gittest.Git(t, b, "rev-parse", "HEAD")
	if ha != hb {
		t.Errorf("two Init commits differ: %s vs %s", ha, hb)
	}
	if got := gittest.Git(t, a, "log", "-1", "--format=%an <%ae> %cI"); got != gittest.AuthorName+" <"+gittest.AuthorEmail+"> 2024-01-02T03:04:05+00:00" {
		t.Errorf("commit identity = %q", got)
	}
	if got := gittest.Git(t, a, "branch", "--show-current"); got != gittest.Branch {
		t.Errorf("branch = %q, want %q", got, gittest.Branch)
	}
}

func TestEnvIgnoresRedirects(t *testing.T) {
	other := gittest.Init(t, filepath.Join(t.TempDir(), "other"))
	t.Setenv("GIT_DIR", filepath.Join(other, ".git"))
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "user.name")
	t.Setenv("GIT_CONFIG_VALUE_0", "Someone Else")
	repo := gittest.Init(t, filepath.Join(t.TempDir(), "repo"))
	if got := gittest.Git(t, repo, "rev-parse", "--show-toplevel"); got != repo {
		t.Errorf("toplevel = %q, want %q", got, repo)
	}
	for _, kv := range gittest.Env() {
		if strings.HasPrefix(kv, "GIT_DIR=") || strings.HasPrefix(kv, "GIT_CONFIG_KEY_") {
			t.Errorf("Env() keeps %q", kv)
		}
	}
}

func TestCloneWorktreeBareOrigin(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	src := gittest.Init(t, filepath.Join(root, "src"))
	clone := gittest.Clone(t, src, filepath.Join(root, "clone"))
	if got := gittest.Git(t, clone, "config", "--get", "remote.origin.url"); got != src {
		t.Errorf("clone origin = %q, want %q", got, src)
	}
	gittest.SetOrigin(t, clone, "git@example.com:o/r.git")
	if got := gittest.Git(t, clone, "config", "--get", "remote.origin.url"); got != "git@example.com:o/r.git" {
		t.Errorf("origin after SetOrigin = %q", got)
	}
	gittest.RemoveOrigin(t, clone)
	gittest.RemoveOrigin(t, clone) // idempotent
	if got := gittest.Git(t, clone, "remote"); got != "" {
		t.Errorf("remotes after RemoveOrigin = %q", got)
	}

	wt := gittest.AddWorktree(t, clone, filepath.Join(root, "wt"), "feature")
	if got := gittest.Git(t, wt, "branch", "--show-current"); got != "feature" {
		t.Errorf("worktree branch = %q", got)
	}
	h := gittest.Commit(t, wt, "dir/file.txt", "x\n", "add file")
	if got := gittest.Git(t, clone, "rev-parse", "feature"); got != h {
		t.Errorf("feature = %q, want %q", got, h)
	}

	project := gittest.BareWithWorktrees(t, src, filepath.Join(root, "project"), "one", "two")
	if got := gittest.Git(t, filepath.Join(project, ".git"), "rev-parse", "--is-bare-repository"); got != "true" {
		t.Errorf("project/.git bare = %q", got)
	}
	for _, w := range []string{"one", "two"} {
		if _, err := os.Stat(filepath.Join(project, w, "README.md")); err != nil {
			t.Errorf("worktree %s: %v", w, err)
		}
	}
	bare := gittest.InitBare(t, filepath.Join(root, "bare.git"))
	gittest.Git(t, clone, "push", "-q", bare, "main")
	if got := gittest.Git(t, bare, "rev-parse", "main"); got != gittest.Git(t, src, "rev-parse", "main") {
		t.Errorf("pushed main = %q", got)
	}
}
