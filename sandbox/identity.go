// Package sandbox holds what agents-sandbox knows about a project and its VMs:
// identity, configuration, state, locks, images, volumes, the VM lifecycle,
// provisioning and tasks. Runtime drivers (sandbox/docker, …) implement the
// Runtime interface defined here.
package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"
)

// Label keys carried by every artifact agents-sandbox creates. Listing and
// pruning go by these labels, never by name guessing.
const (
	LabelProject  = "org.agents-sandbox.project"  // repo slug
	LabelCheckout = "org.agents-sandbox.checkout" // checkout slug
	LabelAgent    = "org.agents-sandbox.agent"    // agent name
	LabelKind     = "org.agents-sandbox.kind"     // Kind
	LabelHash     = "org.agents-sandbox.hash"     // content hash of an image build
	LabelDir      = "org.agents-sandbox.dir"      // project directory (informational)
	LabelPrint    = "org.agents-sandbox.fingerprint"
	LabelLastUsed = "org.agents-sandbox.last-used"
)

// Kind is the value of the org.agents-sandbox.kind label.
type Kind string

// The kinds of artifact agents-sandbox creates.
const (
	KindVM     Kind = "vm"
	KindTask   Kind = "task"
	KindHome   Kind = "home"
	KindRunner Kind = "runner"
	KindProxy  Kind = "proxy"
	KindNet    Kind = "network"
)

// LegacyPrefix is the name prefix of the earlier artifact layout
// (agents-sandbox-<checkout-slug>-<agent>, …). Such artifacts are still found and reused.
const LegacyPrefix = "agents-sandbox-"

// ErrNotCheckout says a directory is not inside a git checkout. Resolve never
// returns it (a plain directory is its own project); callers that need a
// checkout return it when Identity.Git is false.
var ErrNotCheckout = errors.New("not a git checkout")

// Identity is a resolved project: where its checkout is and the slugs that key
// every artifact. It is plain data and JSON-serializable.
type Identity struct {
	// Dir is the directory Resolve was called with, absolute and symlink-free.
	Dir string `json:"dir"`
	// ProjectDir is the checkout root: the enclosing work tree root (also for a
	// linked worktree inside the checkout), or the directory holding a bare
	// `.git`. It is what /workspace shows.
	ProjectDir string `json:"project_dir"`
	// WorkTree is the work tree Dir belongs to (differs from ProjectDir for a
	// linked worktree inside the checkout). Empty for a non-git directory.
	WorkTree string `json:"work_tree,omitempty"`
	// RelDir is Dir relative to ProjectDir, slash-separated ("." at the root).
	RelDir string `json:"rel_dir"`
	// GitCommonDir is the resolved git common dir the checkout slug hashes.
	GitCommonDir string `json:"git_common_dir,omitempty"`
	// Git is false for a directory outside any git checkout (see Resolve).
	Git bool `json:"git"`
	// Bare is true for a bare checkout (project/.git is a bare repository).
	Bare bool `json:"bare,omitempty"`
	// Origin is the remote.origin.url as git reports it, empty without one.
	Origin string `json:"origin,omitempty"`
	// NormalizedOrigin is Origin normalized (host/owner/repo, lower-case host,
	// no scheme, user, port or .git suffix).
	NormalizedOrigin string `json:"normalized_origin,omitempty"`
	// CheckoutSlug is <name>-<hash> with the hash over GitCommonDir.
	CheckoutSlug string `json:"checkout_slug"`
	// RepoSlug is <name>-<hash> with the hash over NormalizedOrigin, or the
	// checkout slug when there is no origin.
	RepoSlug string `json:"repo_slug"`
}

// Resolve finds the project that dir belongs to.
//
// dir may be the checkout root, any directory below it, a linked worktree
// (inside or outside the checkout directory) or the directory holding a bare
// `.git`. Symlinks are resolved first, so every path to the same checkout
// gives the same identity. The checkout slug hashes the resolved git common
// dir; a linked worktree outside its checkout's directory hashes its own git
// dir (`<common>/worktrees/<name>`) instead and is its own project.
//
// Fallback for non-checkouts: a directory outside any git checkout is not an
// error. It is its own project: ProjectDir is the directory itself, Git is
// false, the checkout slug is `<dir name>-<hash of the resolved path>` and the
// repo slug equals it. Callers that require a checkout test Identity.Git and
// return ErrNotCheckout.
//
// git runs with the user's configuration but without GIT_DIR, GIT_WORK_TREE
// and the other variables that would point it at another repository.
// Errors: dir does not exist or is not a directory; git is not installed;
// git fails for a reason other than "not a git repository" (a repository
// owned by another user, say — the error quotes git).
func Resolve(dir string) (Identity, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Identity{}, fmt.Errorf("resolve %q: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return Identity{}, fmt.Errorf("resolve %q: %w", dir, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return Identity{}, fmt.Errorf("resolve %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return Identity{}, fmt.Errorf("resolve %q: not a directory", dir)
	}
	id := Identity{Dir: real}

	common, gitErr := gitOut(real, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if gitErr != nil {
		// A directory holding a bare `.git` (project/.git bare, worktrees
		// inside project/): git from project/ itself does not see it.
		switch bareDir := filepath.Join(real, ".git"); {
		case isBareRepo(bareDir):
			common = bareDir
		case errors.Is(gitErr, errNotRepo):
			return resolveNonGit(id), nil
		default:
			return Identity{}, fmt.Errorf("resolve %q: %w", dir, gitErr)
		}
	}
	common, err = filepath.EvalSymlinks(common)
	if err != nil {
		return Identity{}, fmt.Errorf("resolve %q: git common dir: %w", dir, err)
	}
	id.Git = true
	id.GitCommonDir = common

	if top, err := gitOut(real, "rev-parse", "--show-toplevel"); err == nil && top != "" {
		if t, err := filepath.EvalSymlinks(top); err == nil {
			id.WorkTree = t
		}
	}
	bare := isBareRepo(common)
	id.Bare = bare

	// The checkout directory owning the common dir: the parent of `.git`.
	var owner string
	if filepath.Base(common) == ".git" {
		owner = filepath.Dir(common)
	}
	switch {
	case owner != "" && (id.WorkTree == "" || within(id.WorkTree, owner)):
		// Main work tree, a linked worktree inside the checkout, or a bare
		// checkout's project directory.
		id.ProjectDir = owner
		id.CheckoutSlug = Slug(filepath.Base(owner), common)
	case id.WorkTree != "":
		// A linked worktree outside its checkout (or a checkout whose git dir
		// lives elsewhere): its own project, keyed by its own git dir.
		id.ProjectDir = id.WorkTree
		gitDir, err := gitOut(real, "rev-parse", "--path-format=absolute", "--git-dir")
		if err != nil {
			return Identity{}, fmt.Errorf("resolve %q: %w", dir, err)
		}
		if g, err := filepath.EvalSymlinks(gitDir); err == nil {
			gitDir = g
		}
		id.CheckoutSlug = Slug(filepath.Base(id.WorkTree), gitDir)
	default:
		// A bare repository not named .git: the repository is the project.
		id.ProjectDir = common
		id.CheckoutSlug = Slug(strings.TrimSuffix(filepath.Base(common), ".git"), common)
	}
	id.RelDir = relSlash(id.ProjectDir, real)

	origin, _ := gitOut(common, "--git-dir="+common, "config", "--get", "remote.origin.url")
	if origin == "" && id.WorkTree != "" {
		origin, _ = gitOut(real, "config", "--get", "remote.origin.url")
	}
	id.Origin = origin
	if origin != "" {
		id.NormalizedOrigin = NormalizeOrigin(origin)
		id.RepoSlug = Slug(repoName(id.NormalizedOrigin), id.NormalizedOrigin)
	} else {
		id.RepoSlug = id.CheckoutSlug
	}
	return id, nil
}

func resolveNonGit(id Identity) Identity {
	id.ProjectDir = id.Dir
	id.RelDir = "."
	id.CheckoutSlug = Slug(filepath.Base(id.Dir), id.Dir)
	id.RepoSlug = id.CheckoutSlug
	return id
}

var (
	errGitMissing = errors.New("git is not installed (install it with your package manager, e.g. apt-get install git)")
	// errNotRepo marks git's "not a git repository" failure.
	errNotRepo = errors.New("not a git repository")
)

// gitOut runs `git -C dir args...` and returns its trimmed standard output.
// Errors wrap errGitMissing, errNotRepo (git found no repository) or the
// exit error with git's standard error quoted.
func gitOut(dir string, args ...string) (string, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return "", errGitMissing
	}
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(gitEnv(os.Environ()), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "not a git repository") {
			err = errNotRepo
		}
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return strings.TrimSpace(string(out)), nil
}

// gitEnv drops the variables that point git at a repository other than the
// one found from its working directory (set, e.g., inside a git hook).
func gitEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE",
			"GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
			"GIT_NAMESPACE", "GIT_PREFIX":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// isBareRepo reports whether dir is a bare repository. It names the
// repository explicitly, so safe.bareRepository=explicit does not hide it.
func isBareRepo(dir string) bool {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return false
	}
	out, err := gitOut(dir, "--git-dir="+dir, "rev-parse", "--is-bare-repository")
	return err == nil && out == "true"
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func relSlash(base, path string) string {
	rel, err := filepath.Rel(base, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "."
	}
	return filepath.ToSlash(rel)
}

var (
	scpLike   = regexp.MustCompile(`^(?:[^@/]+@)?(\[[^\]/]*\]|[^:/\[]+):(.*)$`)
	schemeURL = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^@/]*@)?(\[[^\]/]*\]|[^/:\[]*)(?::\d*)?(/.*)?$`)
)

// NormalizeOrigin turns a git remote URL into host/path form so that
// `git@host:o/r.git`, `https://host/o/r` and `ssh://git@host/o/r.git` compare
// equal: no scheme, user or port; lower-case host; no trailing `.git` or `/`.
// An IPv6 host keeps its brackets. A local path or file:// URL becomes a
// cleaned path starting with "/".
func NormalizeOrigin(u string) string {
	u = strings.TrimSpace(u)
	var host, path string
	if m := schemeURL.FindStringSubmatch(u); m != nil {
		host, path = m[1], m[2]
		if strings.HasPrefix(strings.ToLower(u), "file://") {
			host = ""
		}
	} else if m := scpLike.FindStringSubmatch(u); m != nil && !strings.HasPrefix(u, "/") && !strings.HasPrefix(u, ".") {
		host, path = m[1], m[2]
	} else {
		path = filepath.ToSlash(filepath.Clean(u))
	}
	path = strings.TrimSuffix(strings.Trim(path, "/"), ".git")
	path = strings.TrimSuffix(path, "/")
	host = strings.ToLower(host)
	if host == "" {
		return "/" + strings.TrimPrefix(path, "/")
	}
	return host + "/" + path
}

func repoName(normalized string) string {
	return filepath.Base(strings.TrimSuffix(normalized, "/"))
}

// maxNameLen bounds the readable part of a slug so that every artifact name
// built from it stays well inside Docker's limits (image repository path
// components ≤ 255, tags ≤ 128).
const maxNameLen = 40

// Slug returns `<name>-<hash>`: name sanitized by SanitizeName, hash the first
// 12 hex digits of sha256(key). The result always matches
// `[a-z0-9][a-z0-9_.-]*`, ends with an alphanumeric and is at most 53 bytes.
func Slug(name, key string) string {
	sum := sha256.Sum256([]byte(key))
	return SanitizeName(name) + "-" + hex.EncodeToString(sum[:])[:12]
}

// SanitizeName lower-cases name and keeps it a valid Docker name and image
// reference component: letters and digits stay (non-ASCII letters are
// transliterated to "x"), every other run of characters becomes one "-",
// leading and trailing separators go, and the result is cut to 40 bytes.
// An empty result becomes "project".
func SanitizeName(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteByte('x')
			dash = false
		default:
			if !dash && b.Len() > 0 {
				b.WriteByte('-')
				dash = true
			}
		}
		if b.Len() >= maxNameLen {
			break
		}
	}
	s := strings.Trim(b.String(), "-")
	if len(s) > maxNameLen {
		s = strings.TrimRight(s[:maxNameLen], "-")
	}
	if s == "" {
		return "project"
	}
	return s
}

// Names are the artifact names of one checkout and agent, as DESIGN.md's
// table gives them.
type Names struct {
	Agent            string `json:"agent"`
	VM               string `json:"vm"`
	TaskPrefix       string `json:"task_prefix"`
	HomeVolumePrefix string `json:"home_volume_prefix"`
	RunnerImage      string `json:"runner_image"`
	RuntimeImageRef  string `json:"runtime_image_ref"`
	StateDir         string `json:"state_dir"`
	RepoConfigDir    string `json:"repo_config_dir"`
	// Legacy names of the earlier layout, still found and reused.
	LegacyVM          string `json:"legacy_vm"`
	LegacyRunnerImage string `json:"legacy_runner_image"`
}

// Names returns every artifact name for agent. dirs gives the XDG base
// directories (see DefaultDirs).
func (id Identity) Names(agent string, dirs Dirs) Names {
	a := SanitizeName(agent)
	s := id.CheckoutSlug
	return Names{
		Agent:             a,
		VM:                s + "-" + a,
		TaskPrefix:        s + "-" + a + "-",
		HomeVolumePrefix:  s + "-" + a + "-",
		RunnerImage:       "agents-sandbox/runner-" + s + ":" + a + "-latest",
		RuntimeImageRef:   s + ":" + a + "-latest",
		StateDir:          filepath.Join(dirs.State, s),
		RepoConfigDir:     filepath.Join(dirs.Config, id.RepoSlug),
		LegacyVM:          LegacyPrefix + s + "-" + a,
		LegacyRunnerImage: "agents-sandbox/" + LegacyPrefix + "runner-" + s + ":" + a + "-latest",
	}
}

// HomeVolumeName returns the name of a new home volume created at t:
// `<checkout-slug>-<agent>-<YYYYMMDDTHHMMSSZ>` in UTC.
func (n Names) HomeVolumeName(t time.Time) string {
	return n.HomeVolumePrefix + t.UTC().Format("20060102T150405Z")
}

// TaskName returns the name of a task sandbox started at t:
// `<checkout-slug>-<agent>-<unix-nanos>`.
func (n Names) TaskName(t time.Time) string {
	return fmt.Sprintf("%s%d", n.TaskPrefix, t.UnixNano())
}

// Labels returns the labels for an artifact of kind k belonging to id and agent.
func (id Identity) Labels(agent string, k Kind) map[string]string {
	return map[string]string{
		LabelProject:  id.RepoSlug,
		LabelCheckout: id.CheckoutSlug,
		LabelAgent:    SanitizeName(agent),
		LabelKind:     string(k),
	}
}

// Dirs are the XDG base directories agents-sandbox uses, already joined with
// "agents-sandbox".
type Dirs struct {
	Config string `json:"config"` // $XDG_CONFIG_HOME/agents-sandbox
	State  string `json:"state"`  // $XDG_STATE_HOME/agents-sandbox
	Cache  string `json:"cache"`  // $XDG_CACHE_HOME/agents-sandbox
}

// DefaultDirs reads XDG_CONFIG_HOME, XDG_STATE_HOME and XDG_CACHE_HOME from
// getenv, falling back to ~/.config, ~/.local/state and ~/.cache.
func DefaultDirs(getenv func(string) string) (Dirs, error) {
	home := getenv("HOME")
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return Dirs{}, fmt.Errorf("find home directory: %w (set HOME)", err)
		}
		home = h
	}
	pick := func(env, def string) string {
		if v := getenv(env); v != "" && filepath.IsAbs(v) {
			return filepath.Join(v, "agents-sandbox")
		}
		return filepath.Join(home, def, "agents-sandbox")
	}
	return Dirs{
		Config: pick("XDG_CONFIG_HOME", ".config"),
		State:  pick("XDG_STATE_HOME", filepath.Join(".local", "state")),
		Cache:  pick("XDG_CACHE_HOME", ".cache"),
	}, nil
}

var (
	dockerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)
	imageRefRe = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ValidDockerName reports whether s is a name Docker accepts for a container
// or volume: `[a-zA-Z0-9][a-zA-Z0-9_.-]+` (at least two characters), at most
// 255 bytes. Slugs and agent names are lower-case; only the home volume's
// timestamp suffix (`…T150405Z`) carries upper-case letters.
func ValidDockerName(s string) bool { return len(s) <= 255 && dockerName.MatchString(s) }

// ValidImageRef reports whether s is a valid `repository:tag` image reference
// (no registry host) per the distribution reference grammar.
func ValidImageRef(s string) bool {
	repo, _, _ := strings.Cut(s, ":")
	return len(repo) <= 255 && imageRefRe.MatchString(s)
}
