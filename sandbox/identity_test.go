package sandbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// tempDir returns a fresh, symlink-free temporary directory.
func tempDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// hash12 is the slug hash, computed here independently of sandbox.Slug.
func hash12(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:12]
}

func resolve(t *testing.T, dir string) sandbox.Identity {
	t.Helper()
	id, err := sandbox.Resolve(dir)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", dir, err)
	}
	return id
}

// TestResolve builds one tree of real repositories and resolves every case
// of issue 2 against it.
func TestResolve(t *testing.T) {
	t.Parallel()
	root := tempDir(t)
	link := filepath.Join(tempDir(t), "link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}

	remote := gittest.Init(t, filepath.Join(root, "remote", "app.git"))
	clone := gittest.Clone(t, remote, filepath.Join(root, "work", "app"))
	gittest.Commit(t, clone, "pkg/sub/file.go", "package sub\n", "add sub")
	// Worktrees are added through the symlinked path: git then records
	// unresolved paths, which Resolve must see through.
	inner := gittest.AddWorktree(t, filepath.Join(link, "work", "app"), filepath.Join(link, "work", "app", ".worktrees", "feat"), "feat")
	inner = strings.Replace(inner, link, root, 1)
	outer := gittest.AddWorktree(t, clone, filepath.Join(root, "elsewhere", "app-outer"), "outer")
	bare := gittest.BareWithWorktrees(t, remote, filepath.Join(root, "bareproj"), "wt1", "wt2")
	clone2 := gittest.Clone(t, remote, filepath.Join(root, "other", "app"))
	lonely := gittest.Init(t, filepath.Join(root, "lonely"))
	plain := filepath.Join(root, "plain", "dir")
	if err := os.MkdirAll(plain, 0o755); err != nil {
		t.Fatal(err)
	}

	cloneCommon := filepath.Join(clone, ".git")
	bareCommon := filepath.Join(bare, ".git")
	cases := []struct {
		name, dir                 string
		project, workTree, rel    string
		common                    string
		git, bare                 bool
		origin                    string
		slugName, slugKey         string // the checkout slug must be <slugName>-hash(slugKey)
		repoSlugName, repoSlugKey string // "" = the repo slug equals the checkout slug
	}{
		{name: "plain clone", dir: clone, project: clone, workTree: clone, rel: ".", common: cloneCommon, git: true,
			origin: remote, slugName: "app", slugKey: cloneCommon, repoSlugName: "app", repoSlugKey: remote},
		{name: "subdirectory", dir: filepath.Join(clone, "pkg", "sub"), project: clone, workTree: clone, rel: "pkg/sub", common: cloneCommon, git: true,
			origin: remote, slugName: "app", slugKey: cloneCommon, repoSlugName: "app", repoSlugKey: remote},
		{name: "linked worktree inside the checkout", dir: inner, project: clone, workTree: inner, rel: ".worktrees/feat", common: cloneCommon, git: true,
			origin: remote, slugName: "app", slugKey: cloneCommon, repoSlugName: "app", repoSlugKey: remote},
		{name: "linked worktree outside the checkout", dir: outer, project: outer, workTree: outer, rel: ".", common: cloneCommon, git: true,
			origin: remote, slugName: "app-outer", slugKey: filepath.Join(cloneCommon, "worktrees", "app-outer"), repoSlugName: "app", repoSlugKey: remote},
		{name: "symlinked path to the checkout", dir: filepath.Join(link, "work", "app", "pkg"), project: clone, workTree: clone, rel: "pkg", common: cloneCommon, git: true,
			origin: remote, slugName: "app", slugKey: cloneCommon, repoSlugName: "app", repoSlugKey: remote},
		{name: "bare checkout from project dir", dir: bare, project: bare, rel: ".", common: bareCommon, git: true, bare: true,
			origin: remote, slugName: "bareproj", slugKey: bareCommon, repoSlugName: "app", repoSlugKey: remote},
		{name: "bare checkout from a worktree inside", dir: filepath.Join(bare, "wt2"), project: bare, workTree: filepath.Join(bare, "wt2"), rel: "wt2", common: bareCommon, git: true, bare: true,
			origin: remote, slugName: "bareproj", slugKey: bareCommon, repoSlugName: "app", repoSlugKey: remote},
		{name: "second clone of the remote", dir: clone2, project: clone2, workTree: clone2, rel: ".", common: filepath.Join(clone2, ".git"), git: true,
			origin: remote, slugName: "app", slugKey: filepath.Join(clone2, ".git"), repoSlugName: "app", repoSlugKey: remote},
		{name: "no origin", dir: lonely, project: lonely, workTree: lonely, rel: ".", common: filepath.Join(lonely, ".git"), git: true,
			slugName: "lonely", slugKey: filepath.Join(lonely, ".git")},
		{name: "not a git checkout (fallback: own project keyed by path)", dir: plain, project: plain, rel: ".",
			slugName: "dir", slugKey: plain},
		{name: "not a git checkout through a symlink", dir: filepath.Join(link, "plain", "dir"), project: plain, rel: ".",
			slugName: "dir", slugKey: plain},
	}
	slugs := map[string]sandbox.Identity{}
	for _, c := range cases {
		id := resolve(t, c.dir)
		slugs[c.name] = id
		t.Run(c.name, func(t *testing.T) {
			check := func(field, got, want string) {
				t.Helper()
				if got != want {
					t.Errorf("%s = %q, want %q", field, got, want)
				}
			}
			check("ProjectDir", id.ProjectDir, c.project)
			check("WorkTree", id.WorkTree, c.workTree)
			check("RelDir", id.RelDir, c.rel)
			check("GitCommonDir", id.GitCommonDir, c.common)
			check("Origin", id.Origin, c.origin)
			if id.Git != c.git || id.Bare != c.bare {
				t.Errorf("Git, Bare = %v, %v, want %v, %v", id.Git, id.Bare, c.git, c.bare)
			}
			// The hash is over the resolved (symlink-free) git common dir (or
			// the worktree's own git dir, or the directory), computed here
			// without sandbox.Slug.
			check("CheckoutSlug", id.CheckoutSlug, c.slugName+"-"+hash12(c.slugKey))
			if c.repoSlugName == "" {
				check("RepoSlug", id.RepoSlug, id.CheckoutSlug)
			} else {
				norm := sandbox.NormalizeOrigin(c.repoSlugKey)
				check("NormalizedOrigin", id.NormalizedOrigin, norm)
				check("RepoSlug", id.RepoSlug, c.repoSlugName+"-"+hash12(norm))
			}
		})
	}

	same := func(a, b string, checkout, repo bool) {
		t.Helper()
		x, y := slugs[a], slugs[b]
		if (x.CheckoutSlug == y.CheckoutSlug) != checkout {
			t.Errorf("checkout slugs of %q (%s) and %q (%s): same = %v, want %v", a, x.CheckoutSlug, b, y.CheckoutSlug, !checkout, checkout)
		}
		if (x.RepoSlug == y.RepoSlug) != repo {
			t.Errorf("repo slugs of %q (%s) and %q (%s): same = %v, want %v", a, x.RepoSlug, b, y.RepoSlug, !repo, repo)
		}
	}
	same("plain clone", "subdirectory", true, true)
	same("plain clone", "linked worktree inside the checkout", true, true)
	same("plain clone", "linked worktree outside the checkout", false, true)
	same("plain clone", "symlinked path to the checkout", true, true)
	same("plain clone", "second clone of the remote", false, true)
	same("bare checkout from project dir", "bare checkout from a worktree inside", true, true)
	same("plain clone", "bare checkout from project dir", false, true)
	same("not a git checkout (fallback: own project keyed by path)", "not a git checkout through a symlink", true, true)
}

func TestResolveOriginForms(t *testing.T) {
	t.Parallel()
	root := tempDir(t)
	origins := []string{
		"git@github.com:Owner/Repo.git",
		"https://github.com/Owner/Repo",
		"ssh://git@github.com/Owner/Repo.git",
		"https://GitHub.com/Owner/Repo/",
		"ssh://git@github.com:22/Owner/Repo",
	}
	var first sandbox.Identity
	for i, o := range origins {
		dir := gittest.Init(t, filepath.Join(root, "r"+string(rune('a'+i)), "repo"))
		gittest.SetOrigin(t, dir, o)
		id := resolve(t, dir)
		if id.Origin != o {
			t.Errorf("Origin = %q, want %q", id.Origin, o)
		}
		if i == 0 {
			first = id
			if want := "repo-" + hash12("github.com/Owner/Repo"); id.RepoSlug != want {
				t.Errorf("RepoSlug of %q = %q, want %q", o, id.RepoSlug, want)
			}
			continue
		}
		if id.RepoSlug != first.RepoSlug {
			t.Errorf("RepoSlug of %q = %q, want %q (same as %q)", o, id.RepoSlug, first.RepoSlug, origins[0])
		}
		if id.CheckoutSlug == first.CheckoutSlug {
			t.Errorf("CheckoutSlug of %q equals that of another checkout: %s", o, id.CheckoutSlug)
		}
	}
}

func TestNormalizeOrigin(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"git@github.com:o/r.git", "github.com/o/r"},
		{"https://github.com/o/r", "github.com/o/r"},
		{"ssh://git@github.com/o/r.git", "github.com/o/r"},
		{"ssh://git@github.com/o/r", "github.com/o/r"},
		{"git://github.com/o/r.git", "github.com/o/r"},
		{"https://github.com/o/r.git", "github.com/o/r"},
		// ports go
		{"ssh://git@github.com:2222/o/r.git", "github.com/o/r"},
		{"https://gitlab.example.com:8443/group/sub/r.git", "gitlab.example.com/group/sub/r"},
		{"ssh://git@host:/o/r", "host/o/r"},
		// users and passwords go
		{"https://user:token@github.com/o/r", "github.com/o/r"},
		{"https://user@github.com/o/r", "github.com/o/r"},
		{"alice@host:o/r", "host/o/r"},
		{"host:o/r", "host/o/r"},
		// trailing slashes go, also after .git
		{"https://github.com/o/r/", "github.com/o/r"},
		{"https://github.com/o/r.git/", "github.com/o/r"},
		{"git@github.com:o/r.git/", "github.com/o/r"},
		{"git@github.com:/o/r.git", "github.com/o/r"},
		// host case folds, path case stays
		{"https://GitHub.COM/Owner/Repo", "github.com/Owner/Repo"},
		{"git@GITHUB.com:Owner/Repo.git", "github.com/Owner/Repo"},
		// white space around
		{"  https://github.com/o/r\n", "github.com/o/r"},
		// IPv6 hosts keep their brackets
		{"ssh://git@[::1]:2222/o/r.git", "[::1]/o/r"},
		{"https://[2001:db8::1]/o/r", "[2001:db8::1]/o/r"},
		{"git@[::1]:o/r.git", "[::1]/o/r"},
		// file paths and file:// URLs agree
		{"/srv/git/r.git", "/srv/git/r"},
		{"/srv/git/r", "/srv/git/r"},
		{"/srv/git//r.git/", "/srv/git/r"},
		{"/srv/git/./x/../r.git", "/srv/git/r"},
		{"file:///srv/git/r.git", "/srv/git/r"},
		{"FILE:///srv/git/r", "/srv/git/r"},
	} {
		if got := sandbox.NormalizeOrigin(c.in); got != c.want {
			t.Errorf("NormalizeOrigin(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestResolveIgnoresGitDirEnv: inside a git hook GIT_DIR points at the hook's
// repository; Resolve must still resolve the directory it was given.
func TestResolveIgnoresGitDirEnv(t *testing.T) {
	root := tempDir(t)
	a := gittest.Init(t, filepath.Join(root, "a"))
	b := gittest.Init(t, filepath.Join(root, "b"))
	t.Setenv("GIT_DIR", filepath.Join(a, ".git"))
	t.Setenv("GIT_WORK_TREE", a)
	id := resolve(t, b)
	if id.ProjectDir != b || id.GitCommonDir != filepath.Join(b, ".git") {
		t.Errorf("with GIT_DIR=%s/.git: ProjectDir = %q, GitCommonDir = %q, want %q", a, id.ProjectDir, id.GitCommonDir, b)
	}
}

// TestResolveBareExplicit: with safe.bareRepository=explicit git refuses to
// discover project/.git from project/; Resolve still finds the bare checkout.
func TestResolveBareExplicit(t *testing.T) {
	root := tempDir(t)
	remote := gittest.Init(t, filepath.Join(root, "remote"))
	bare := gittest.BareWithWorktrees(t, remote, filepath.Join(root, "proj"), "wt")
	cfg := filepath.Join(root, "gitconfig")
	if err := os.WriteFile(cfg, []byte("[safe]\n\tbareRepository = explicit\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_CONFIG_GLOBAL", cfg)
	for _, dir := range []string{bare, filepath.Join(bare, "wt")} {
		id := resolve(t, dir)
		if id.ProjectDir != bare || !id.Bare || id.Origin != remote {
			t.Errorf("Resolve(%s): ProjectDir = %q, Bare = %v, Origin = %q; want %q, true, %q", dir, id.ProjectDir, id.Bare, id.Origin, bare, remote)
		}
	}
}

// TestResolveRefusedRepository: a checkout git refuses to read (owned by
// another user) is an error quoting git, not the non-checkout fallback.
func TestResolveRefusedRepository(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a repository to another user")
	}
	root := tempDir(t)
	repo := gittest.Init(t, filepath.Join(root, "theirs"))
	if err := filepath.Walk(repo, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 65534, 65534)
	}); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(root, "gitconfig")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_CONFIG_GLOBAL", empty)
	_, err := sandbox.Resolve(repo)
	if err == nil || !strings.Contains(err.Error(), "dubious ownership") {
		t.Fatalf("Resolve of a repository owned by another user: err = %v, want git's dubious ownership error", err)
	}
}

func TestResolveErrors(t *testing.T) {
	t.Parallel()
	root := tempDir(t)
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(root, "missing"), file} {
		if _, err := sandbox.Resolve(dir); err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("Resolve(%s): err = %v, want an error naming the path", dir, err)
		}
	}
	if _, err := sandbox.Resolve(filepath.Join(root, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Resolve(missing): err = %v, want os.ErrNotExist", err)
	}
}

// Independent statements of the name grammars, written out from their
// sources rather than taken from package sandbox.
var (
	// moby daemon/names.go: RestrictedNameChars, for containers and volumes.
	dockerNameGrammar = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)
	// distribution/reference regexp.go: ReferenceRegexp.
	referenceGrammar = func() *regexp.Regexp {
		alnum := `[a-z0-9]+`
		sep := `(?:[._]|__|[-]+)`
		pathComponent := alnum + `(?:` + sep + alnum + `)*`
		domainComponent := `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
		domainName := domainComponent + `(?:\.` + domainComponent + `)*`
		host := `(?:` + domainName + `|\[(?:[a-fA-F0-9:]+)\])`
		domain := host + `(?::[0-9]+)?`
		name := `(?:` + domain + `/)?` + pathComponent + `(?:/` + pathComponent + `)*`
		tag := `[\w][\w.-]{0,127}`
		digest := `[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][[:xdigit:]]{32,}`
		return regexp.MustCompile(`^(` + name + `)(?::(` + tag + `))?(?:@(` + digest + `))?$`)
	}()
)

// checkDockerName checks a container or volume name; lower says it must also
// be lower-case (everything but the home volume's timestamp).
func checkDockerName(t *testing.T, what, s string, lower bool) {
	t.Helper()
	if !sandbox.ValidDockerName(s) || !dockerNameGrammar.MatchString(s) || len(s) > 255 {
		t.Errorf("%s %q is not a valid Docker name", what, s)
	}
	if lower && s != strings.ToLower(s) {
		t.Errorf("%s %q is not lower-case", what, s)
	}
}

func checkImageRef(t *testing.T, what, s string) {
	t.Helper()
	m := referenceGrammar.FindStringSubmatch(s)
	if !sandbox.ValidImageRef(s) || m == nil || m[2] == "" || len(m[1]) > 255 {
		t.Errorf("%s %q is not a valid repository:tag image reference", what, s)
		return
	}
	// The first component must not read as a registry host.
	if first, _, ok := strings.Cut(m[1], "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		t.Errorf("%s %q: first component %q would be taken for a registry", what, s, first)
	}
}

func TestNamesAlwaysValid(t *testing.T) {
	t.Parallel()
	root := tempDir(t)
	folders := []string{
		"My Project", "UPPER", "ünïcödé-名前", strings.Repeat("a", 200), strings.Repeat("Ab-", 66),
		"!!!", "...", "-_-", "  spaced  ", "a", "1", "emoji 🚀 dir", "dots.in.name", "__init__",
		"x" + strings.Repeat("-", 60) + "y", "名前",
	}
	agents := []string{"opencode", "claude-code", "Claude Code", "", "!!!", strings.Repeat("Z", 300), "ünï", "a", "_x_"}
	when := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.FixedZone("x", 3600))
	seen := map[string]string{}
	for i, f := range folders {
		dir := filepath.Join(root, string(rune('a'+i)), f)
		if i%2 == 0 {
			gittest.Init(t, dir)
			gittest.SetOrigin(t, dir, "https://example.com/"+strings.ReplaceAll(f, " ", "%20")+"/"+f+".git")
		} else if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		id := resolve(t, dir)
		if prev, dup := seen[id.CheckoutSlug]; dup {
			t.Errorf("folders %q and %q share checkout slug %s", prev, f, id.CheckoutSlug)
		}
		seen[id.CheckoutSlug] = f
		for _, slug := range []string{id.CheckoutSlug, id.RepoSlug} {
			checkDockerName(t, "slug of "+f, slug, true)
			if len(slug) > 53 {
				t.Errorf("slug %q of %q is %d bytes, want ≤ 53", slug, f, len(slug))
			}
		}
		dirs := sandbox.Dirs{Config: "/c/agents-sandbox", State: "/s/agents-sandbox"}
		for _, a := range agents {
			n := id.Names(a, dirs)
			what := "folder " + f + ", agent " + a + ": "
			if !regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`).MatchString(n.Agent) {
				t.Errorf("%sagent %q is not a sanitized name", what, n.Agent)
			}
			checkDockerName(t, what+"VM", n.VM, true)
			checkDockerName(t, what+"legacy VM", n.LegacyVM, true)
			checkDockerName(t, what+"task", n.TaskName(when), true)
			checkDockerName(t, what+"home volume prefix", n.HomeVolumePrefix+"x", true)
			checkDockerName(t, what+"home volume", n.HomeVolumeName(when), false)
			checkImageRef(t, what+"runner image", n.RunnerImage)
			checkImageRef(t, what+"legacy runner image", n.LegacyRunnerImage)
			checkImageRef(t, what+"runtime image ref", n.RuntimeImageRef)
			if got, want := n.HomeVolumeName(when), n.HomeVolumePrefix+"20240506T060809Z"; got != want {
				t.Errorf("%sHomeVolumeName = %q, want %q", what, got, want)
			}
			if got, want := n.TaskName(when), n.TaskPrefix+"1714975689123456789"; got != want {
				t.Errorf("%sTaskName = %q, want %q", what, got, want)
			}
			if n.StateDir != filepath.Join(dirs.State, id.CheckoutSlug) || n.RepoConfigDir != filepath.Join(dirs.Config, id.RepoSlug) {
				t.Errorf("%sStateDir, RepoConfigDir = %q, %q", what, n.StateDir, n.RepoConfigDir)
			}
			for k, v := range id.Labels(a, sandbox.KindVM) {
				if v == "" || strings.ContainsAny(v, "\x00\n") {
					t.Errorf("%slabel %s = %q", what, k, v)
				}
			}
		}
	}
}

func TestNamesLayout(t *testing.T) {
	t.Parallel()
	id := sandbox.Identity{CheckoutSlug: "app-0123456789ab", RepoSlug: "repo-ba9876543210"}
	n := id.Names("claude-code", sandbox.Dirs{Config: "/cfg/agents-sandbox", State: "/state/agents-sandbox"})
	want := sandbox.Names{
		Agent:             "claude-code",
		VM:                "app-0123456789ab-claude-code",
		TaskPrefix:        "app-0123456789ab-claude-code-",
		HomeVolumePrefix:  "app-0123456789ab-claude-code-",
		RunnerImage:       "agents-sandbox/runner-app-0123456789ab:claude-code-latest",
		RuntimeImageRef:   "app-0123456789ab:claude-code-latest",
		StateDir:          "/state/agents-sandbox/app-0123456789ab",
		RepoConfigDir:     "/cfg/agents-sandbox/repo-ba9876543210",
		LegacyVM:          "agents-sandbox-app-0123456789ab-claude-code",
		LegacyRunnerImage: "agents-sandbox/agents-sandbox-runner-app-0123456789ab:claude-code-latest",
	}
	if n != want {
		t.Errorf("Names = %+v\nwant    %+v", n, want)
	}
	labels := id.Labels("claude-code", sandbox.KindHome)
	wantLabels := map[string]string{
		sandbox.LabelProject: "repo-ba9876543210", sandbox.LabelCheckout: "app-0123456789ab",
		sandbox.LabelAgent: "claude-code", sandbox.LabelKind: "home",
	}
	if len(labels) != len(wantLabels) {
		t.Errorf("Labels = %v, want %v", labels, wantLabels)
	}
	for k, v := range wantLabels {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
}

func TestSanitizeName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"My Project", "my-project"},
		{"UPPER", "upper"},
		{"ünï", "xnx"},
		{"!!!", "project"},
		{"", "project"},
		{"...", "project"},
		{"a..b__c--d", "a-b-c-d"},
		{"  x  ", "x"},
		{strings.Repeat("a", 200), strings.Repeat("a", 40)},
		{strings.Repeat("a", 39) + "-bcd", strings.Repeat("a", 39)},
	} {
		if got := sandbox.SanitizeName(c.in); got != c.want {
			t.Errorf("SanitizeName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestValidDockerName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"app-0123", true},
		{"ab", true},
		{"a_b.c-d", true},
		{"app-x-20240506T060809Z", true},
		{"a", false}, // Docker wants two characters
		{"-ab", false},
		{".ab", false},
		{"a b", false},
		{"a/b", false},
		{"a:b", false},
		{"ünï", false},
		{strings.Repeat("a", 255), true},
		{strings.Repeat("a", 256), false},
	} {
		if got := sandbox.ValidDockerName(c.s); got != c.want {
			t.Errorf("ValidDockerName(%q) = %v, want %v", c.s, got, c.want)
		}
		if got := dockerNameGrammar.MatchString(c.s) && len(c.s) <= 255; got != c.want {
			t.Errorf("Docker name grammar(%q) = %v, want %v (test table is wrong)", c.s, got, c.want)
		}
	}
}

func TestValidImageRef(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"app:latest", true},
		{"agents-sandbox/runner-app-0123:claude-code-latest", true},
		{"app--x:latest", true},
		{"a__b:latest", true},
		{"app:Tag_1.2-x", true},
		{"app", false}, // a tag is required
		{"app-:latest", false},
		{"app:.bad", false},
		{"App:latest", false},
		{"a___b:latest", false},
		{"app:" + strings.Repeat("t", 128), true},
		{"app:" + strings.Repeat("t", 129), false},
		{strings.Repeat("a", 255) + ":t", true},
		{strings.Repeat("a", 256) + ":t", false},
	} {
		if got := sandbox.ValidImageRef(c.s); got != c.want {
			t.Errorf("ValidImageRef(%q) = %v, want %v", c.s, got, c.want)
		}
		m := referenceGrammar.FindStringSubmatch(c.s)
		if got := m != nil && m[2] != "" && len(m[1]) <= 255; got != c.want {
			t.Errorf("reference grammar(%q) = %v, want %v (test table is wrong)", c.s, got, c.want)
		}
	}
}

func TestDefaultDirs(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HOME": "/home/u", "XDG_CONFIG_HOME": "/xdg/cfg", "XDG_STATE_HOME": "relative/ignored"}
	d, err := sandbox.DefaultDirs(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.Dirs{Config: "/xdg/cfg/agents-sandbox", State: "/home/u/.local/state/agents-sandbox", Cache: "/home/u/.cache/agents-sandbox"}
	if d != want {
		t.Errorf("DefaultDirs = %+v, want %+v", d, want)
	}
}
