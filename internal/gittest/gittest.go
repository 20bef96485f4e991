// Package gittest makes real git repositories in temporary directories for
// tests: init, commit, clone, linked worktrees, bare checkouts with
// worktrees, origins. It runs the real git binary with a deterministic
// environment: fixed author and committer, fixed dates, branch "main", and no
// global or system configuration (GIT_CONFIG_GLOBAL=/dev/null,
// GIT_CONFIG_NOSYSTEM=1), so the machine's git setup cannot change results.
//
// Every helper fails the test on error; none of them sleeps or touches
// anything outside the paths it is given.
package gittest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Fixed identity and date of every commit made by this package.
const (
	AuthorName  = "Agents Sandbox Test"
	AuthorEmail = "test@agents-sandbox.invalid"
	Date        = "2024-01-02T03:04:05Z"
	Branch      = "main"
)

// Env returns the environment git runs with here: the process environment
// without variables that redirect git to another repository or add
// configuration, plus the deterministic settings described in the package
// comment.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !redirects(name) {
			env = append(env, kv)
		}
	}
	return append(env,
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME="+AuthorName,
		"GIT_AUTHOR_EMAIL="+AuthorEmail,
		"GIT_AUTHOR_DATE="+Date,
		"GIT_COMMITTER_NAME="+AuthorName,
		"GIT_COMMITTER_EMAIL="+AuthorEmail,
		"GIT_COMMITTER_DATE="+Date,
		"GIT_TERMINAL_PROMPT=0",
		"LC_ALL=C",
	)
}

// Git runs `git -C dir args...` and returns its standard output with
// surrounding white space trimmed. It fails t, quoting git's standard error,
// when git exits non-zero or is not installed.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is not installed (apt-get install git): %v", err)
	}
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = Env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("git -C %s %s: %v\n%s", dir, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// Init creates dir (and its parents) if needed, makes it a repository on
// branch main and commits README.md. It returns dir.
func Init(t testing.TB, dir string) string {
	t.Helper()
	mkdir(t, dir)
	Git(t, dir, "init", "-q", "-b", Branch)
	Commit(t, dir, "README.md", "# test\n", "initial commit")
	return dir
}

// InitBare makes dir a bare repository with no commits and returns dir.
func InitBare(t testing.TB, dir string) string {
	t.Helper()
	mkdir(t, dir)
	Git(t, dir, "init", "-q", "--bare", "-b", Branch)
	return dir
}

// Commit writes content to file (a slash-separated path relative to the
// work tree at dir, parents created), stages it and commits it with msg.
// It returns the new commit's hash.
func Commit(t testing.TB, dir, file, content, msg string) string {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(file))
	mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatalf("write %s: %v", p, err)
	}
	Git(t, dir, "add", "--", file)
	Git(t, dir, "commit", "-q", "-m", msg)
	return Git(t, dir, "rev-parse", "HEAD")
}

// Clone clones src (a path or URL git understands) into dst and returns dst.
// The clone's origin is src as git records it.
func Clone(t testing.TB, src, dst string) string {
	t.Helper()
	mkdir(t, filepath.Dir(dst))
	Git(t, filepath.Dir(dst), "clone", "-q", src, dst)
	return dst
}

// AddWorktree adds a linked worktree of the repository at repo (a work tree
// or a bare repository) at path, on a new branch named branch. It returns
// path.
func AddWorktree(t testing.TB, repo, path, branch string) string {
	t.Helper()
	mkdir(t, filepath.Dir(path))
	Git(t, repo, "worktree", "add", "-q", "-b", branch, path)
	return path
}

// BareWithWorktrees makes the layout of a bare checkout: project/.git is a
// bare clone of src, and each name in worktrees becomes a linked worktree at
// project/<name> on a new branch of the same name. It returns project.
func BareWithWorktrees(t testing.TB, src, project string, worktrees ...string) string {
	t.Helper()
	mkdir(t, project)
	gitDir := filepath.Join(project, ".git")
	Git(t, project, "clone", "-q", "--bare", src, gitDir)
	for _, w := range worktrees {
		AddWorktree(t, gitDir, filepath.Join(project, w), w)
	}
	return project
}

// SetOrigin sets (adding or replacing) remote.origin.url of the repository
// at dir to url. No network access happens.
func SetOrigin(t testing.TB, dir, url string) {
	t.Helper()
	Git(t, dir, "config", "remote.origin.url", url)
}

// RemoveOrigin removes the origin remote of the repository at dir if it has one.
func RemoveOrigin(t testing.TB, dir string) {
	t.Helper()
	if strings.Contains("\n"+Git(t, dir, "remote")+"\n", "\norigin\n") {
		Git(t, dir, "remote", "remove", "origin")
	}
}

// redirects reports whether the variable name points git at a repository
// other than the one found from its working directory, or adds configuration.
func redirects(name string) bool {
	switch name {
	case "GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE",
		"GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE",
		"GIT_PREFIX", "GIT_CEILING_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS",
		"GIT_CONFIG_COUNT", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM":
		return true
	}
	return strings.HasPrefix(name, "GIT_CONFIG_KEY_") || strings.HasPrefix(name, "GIT_CONFIG_VALUE_")
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
}
