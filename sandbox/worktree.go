package sandbox

// Worktree sessions (`--worktree NAME[:BASE]`): the agent works in a git
// worktree that lives inside the VM, on the home volume, and the host
// checkout stays untouched.
//
// How it keeps the host untouched. Every VM of a git checkout mounts the
// checkout's git common dir read-only at HostGitDir (vmSpec). Inside the VM a
// private bare repository on the home volume (WorktreeRepo) has the remote
// "host" pointing at that read-only mount; `git fetch host` copies the host's
// branches into refs/remotes/host/* (and the tags pointing into them), and
// each session is a `git worktree add` of that private repository, on branch
// agents-sandbox/NAME, in WorktreesDir/NAME. A fetch from a local path only
// reads the source, and the read-only mount makes sure of it: nothing in the
// VM can write the host's .git through HostGitDir, and no command of a
// session runs in /workspace. On the host, agents-sandbox only runs read-only
// git commands (rev-parse, check-ref-format) until `worktree export`, the one
// operation that writes the host repository: it bundles the session's branch
// in the VM, copies the bundle out and runs `git fetch` from it on the host.
//
// Limits. The VM itself still mounts the checkout at /workspace read-write
// (it is the same VM as for sessions without a worktree): a session's
// commands start in its worktree, but an agent that changes to /workspace
// can write there. Sessions belong to the VM of one checkout and agent (they
// live on its home volume). Submodules are initialised in a new session
// from the host's own submodule repositories (.git/modules/NAME, read-only);
// a submodule the host never checked out, or one whose repository lacks the
// recorded commit, stays uninitialised (a warning says so) and the agent can
// initialise it itself from its URL; nested submodules stay uninitialised
// (a warning says so). Git LFS is off in the private
// repository (the filters are `cat`): LFS pointers stay pointers, and a
// large file the agent adds is committed as a plain blob.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// HostGitDir is where every VM of a git checkout sees the checkout's git
// common dir, read-only.
const HostGitDir = "/host-git"

// Paths of the worktree sessions inside the VM, on the home volume.
const (
	// WorktreeRepo is the private bare repository the sessions' worktrees
	// belong to; its remote "host" is HostGitDir.
	WorktreeRepo = HomeDir + "/.agents-sandbox/repo.git"
	// WorktreesDir holds one worktree per session, WorktreesDir/NAME.
	WorktreesDir = HomeDir + "/.agents-sandbox/worktrees"
	// WorktreeBranchPrefix starts the branch of every session, in the VM's
	// private repository and, after an export, in the host repository.
	WorktreeBranchPrefix = "agents-sandbox/"
)

// maxWorktreeName bounds a session name (bytes).
const maxWorktreeName = 100

// ErrBadWorktree marks an invalid `--worktree NAME[:BASE]`: a NAME that is
// not a valid branch name or a BASE that does not exist. Such errors wrap
// ErrInvalid too.
var ErrBadWorktree = errors.New("invalid worktree")

// WorktreeSpec is a parsed `NAME[:BASE]`.
type WorktreeSpec struct {
	// Name is the session's name; its branch is WorktreeBranchPrefix+Name.
	Name string `json:"name"`
	// Base is the commit-ish (branch, tag, commit, HEAD~2, ...) a new
	// session starts from, resolved in the host checkout from the caller's
	// directory. Empty: HEAD. Reopening a session with a Base other than
	// the one it started from is an error (ErrConflict).
	Base string `json:"base,omitempty"`
}

// String formats the spec back as NAME[:BASE].
func (s WorktreeSpec) String() string {
	if s.Base == "" {
		return s.Name
	}
	return s.Name + ":" + s.Base
}

// ParseWorktreeSpec parses `NAME[:BASE]` and checks NAME (see
// CheckWorktreeName) and the syntax of BASE (not empty after a colon, no
// leading '-', no control characters). Whether BASE exists is checked when
// the session is opened. Errors wrap ErrInvalid and ErrBadWorktree.
func ParseWorktreeSpec(s string) (WorktreeSpec, error) {
	name, base, hasBase := strings.Cut(s, ":")
	if err := CheckWorktreeName(name); err != nil {
		return WorktreeSpec{}, err
	}
	if hasBase {
		switch {
		case base == "":
			return WorktreeSpec{}, fmt.Errorf("worktree %q: %w: %w: BASE after the colon is empty; write NAME:BASE (e.g. %s:main) or just NAME to start from HEAD", s, ErrInvalid, ErrBadWorktree, name)
		case strings.HasPrefix(base, "-"):
			return WorktreeSpec{}, fmt.Errorf("worktree %q: %w: %w: BASE %q starts with '-'; name a branch, tag or commit", s, ErrInvalid, ErrBadWorktree, base)
		case strings.IndexFunc(base, unicode.IsControl) >= 0:
			return WorktreeSpec{}, fmt.Errorf("worktree %q: %w: %w: BASE holds a control character; name a branch, tag or commit", s, ErrInvalid, ErrBadWorktree)
		}
	}
	return WorktreeSpec{Name: name, Base: base}, nil
}

// CheckWorktreeName checks a session name: agents-sandbox/NAME must be a
// valid branch name (`git check-ref-format --branch`), without "@{", at most
// 100 bytes. Errors wrap ErrInvalid and ErrBadWorktree and say how to fix
// the name.
func CheckWorktreeName(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("worktree name %q: %w: %w: %s; use letters, digits, '-', '_', '.' and '/' (e.g. fix-login)", name, ErrInvalid, ErrBadWorktree, why)
	}
	switch {
	case name == "":
		return bad("the name is empty")
	case len(name) > maxWorktreeName:
		return bad(fmt.Sprintf("it is longer than %d bytes", maxWorktreeName))
	case strings.Contains(name, "@{"):
		return bad("it contains \"@{\"")
	case strings.HasPrefix(name, "-"):
		return bad("it starts with '-'")
	case strings.IndexFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return bad("it contains white space or a control character")
	}
	if _, err := exec.LookPath("git"); err != nil {
		return fmt.Errorf("check worktree name %q: %w", name, errGitMissing)
	}
	cmd := exec.Command("git", "check-ref-format", "--branch", WorktreeBranchPrefix+name)
	cmd.Dir = string(filepath.Separator)
	cmd.Env = append(gitEnv(os.Environ()), "LC_ALL=C", "GIT_CEILING_DIRECTORIES=/")
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return bad("agents-sandbox/" + name + " is not a valid git branch name")
		}
		return fmt.Errorf("check worktree name %q: %w", name, err)
	}
	return nil
}

// WorktreeSession is one worktree session as it stands in the VM.
type WorktreeSession struct {
	Name string `json:"name"`
	// Branch is the session's branch (agents-sandbox/NAME).
	Branch string `json:"branch"`
	// Path is the worktree's directory inside the VM.
	Path string `json:"path"`
	// Base is the BASE the session started from, as given ("HEAD" when
	// none was).
	Base string `json:"base"`
	// BaseCommit is the commit BASE named when the session started.
	BaseCommit string `json:"base_commit"`
	// BaseRef is the ref in the VM's private repository that follows BASE
	// when BASE named a host branch (refs/remotes/host/main); empty when
	// BASE was a commit, a tag or a detached HEAD. Ahead and Behind count
	// against it (as of the last fetch from the host), else against
	// BaseCommit.
	BaseRef string `json:"base_ref,omitempty"`
	// Head is the commit the session's branch points to.
	Head string `json:"head"`
	// Ahead counts the branch's commits that BASE does not have; Behind
	// the commits of BASE the branch does not have.
	Ahead  int `json:"ahead"`
	Behind int `json:"behind"`
	// Dirty says the worktree has uncommitted changes or untracked files
	// (not ignored ones).
	Dirty bool `json:"dirty"`
	// Missing says the worktree directory is gone (its branch is kept;
	// opening the session again checks the branch out again).
	Missing bool `json:"missing,omitempty"`
	// WorkDir is where a command of this session starts: the directory of
	// the worktree matching the caller's place in the checkout, or the
	// worktree's root. Set by OpenWorktree only.
	WorkDir string `json:"workdir,omitempty"`
	// Created says OpenWorktree made the session (false: it continued it).
	Created bool `json:"created,omitempty"`
	// Warnings are problems that did not stop the session (a submodule
	// that could not be checked out, a failed refresh from the host).
	Warnings []string `json:"warnings,omitempty"`
}

// worktreePrelude is sourced by every in-VM worktree script: paths, exit
// codes (3 invalid, 4 not found, 5 conflict), and status_line, which sets
// head, ahead, behind, dirty, missing, ... for session $1 and prints them as
// tab-separated fields: name, path, head, base commit, base ref, ahead,
// behind, dirty, missing, base (last: the only free-form field).
const worktreePrelude = `set -eu
repo=$AS_REPO
export GIT_TERMINAL_PROMPT=0 GIT_LFS_SKIP_SMUDGE=1 LC_ALL=C
fail() { code=$1; shift; printf '%s\n' "$*" >&2; exit "$code"; }
command -v git >/dev/null 2>&1 || fail 3 "git is not installed in the VM image; add it to .agents-sandbox/Dockerfile (the default image has it)"
g() { git -C "$repo" "$@"; }
has_session() { [ -f "$repo/HEAD" ] && g config --get "agents-sandbox.$1.basecommit" >/dev/null 2>&1; }
status_line() {
  n=$1; wt=$AS_WORKTREES/$n
  base=$(g config --get "agents-sandbox.$n.base" || true)
  bc=$(g config --get "agents-sandbox.$n.basecommit" || true)
  bref=$(g config --get "agents-sandbox.$n.baseref" || true)
  head=$(g rev-parse -q --verify "refs/heads/agents-sandbox/$n^{commit}" || true)
  tip=$bc
  if [ -n "$bref" ] && t=$(g rev-parse -q --verify "$bref^{commit}"); then tip=$t; fi
  ahead=0; behind=0
  if [ -n "$head" ] && [ -n "$tip" ] && counts=$(g rev-list --left-right --count "$tip...$head" 2>/dev/null); then
    behind=${counts%%[!0-9]*}; ahead=${counts##*[!0-9]}
  fi
  dirty=0; missing=0
  if [ -e "$wt/.git" ]; then
    if st=$(GIT_OPTIONAL_LOCKS=0 git -C "$wt" status --porcelain --untracked-files=normal 2>/dev/null); then
      [ -z "$st" ] || dirty=1
    else
      dirty=1
    fi
  else
    missing=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$wt" "$head" "$bc" "$bref" "$ahead" "$behind" "$dirty" "$missing" "$base"
}
`

// worktreeRootScript lets git (run by any user in the VM) read the host
// repository and its submodule repositories under the read-only mount,
// whoever owns them there, and use the private repository and the session's
// worktree as another user than their owner (shell --root): git's
// safe.directory, in the VM's system config.
const worktreeRootScript = `set -eu
command -v git >/dev/null 2>&1 || exit 0
add() { git config --system --get-all safe.directory 2>/dev/null | grep -qxF "$1" || git config --system --add safe.directory "$1"; }
add "$AS_REPO"
add "$AS_WORKTREES/$AS_NAME"
[ -d "$AS_HOST_GIT" ] || exit 0
add "$AS_HOST_GIT"
for top in $AS_MODULE_DIRS; do
  [ -d "$top/modules" ] || continue
  find "$top/modules" -name HEAD -type f 2>/dev/null | while IFS= read -r h; do
    d=${h%/HEAD}
    if [ -d "$d/objects" ] && [ -d "$d/refs" ]; then add "$d"; fi
  done
done
`

// worktreeOpenScript creates or continues session AS_NAME and prints its
// status line, then the directory commands start in.
const worktreeOpenScript = worktreePrelude + `
n=$AS_NAME; wt=$AS_WORKTREES/$n; branch=agents-sandbox/$n
[ -d "$AS_HOST_GIT" ] || fail 4 "the host repository is not mounted at $AS_HOST_GIT in this VM (it was created by an older agents-sandbox); run agents-sandbox create to recreate it (the home volume is kept)"
if [ ! -f "$repo/HEAD" ]; then
  mkdir -p "$(dirname "$repo")"
  tmp=$repo.new.$$
  rm -rf "$tmp"
  git init -q --bare "$tmp"
  git -C "$tmp" config remote.host.url "$AS_HOST_GIT"
  git -C "$tmp" config remote.host.fetch '+refs/heads/*:refs/remotes/host/*'
  git -C "$tmp" config core.logAllRefUpdates true
  git -C "$tmp" config filter.lfs.smudge cat
  git -C "$tmp" config filter.lfs.clean cat
  git -C "$tmp" config filter.lfs.process ''
  git -C "$tmp" config filter.lfs.required false
  mv "$tmp" "$repo"
fi
for kv in "user.name=$AS_USER_NAME" "user.email=$AS_USER_EMAIL"; do
  k=${kv%%=*}; v=${kv#*=}
  if [ -n "$v" ] && ! git config --global --get "$k" >/dev/null 2>&1 && ! g config --get "$k" >/dev/null 2>&1; then
    g config "$k" "$v"
  fi
done
if has_session "$n"; then
  old=$(g config --get "agents-sandbox.$n.base" || true)
  if [ -n "$AS_BASE_GIVEN" ] && [ "$old" != "$AS_BASE" ]; then
    fail 5 "worktree session $n exists and started from $old, not $AS_BASE; continue it with --worktree $n (no BASE), or remove it first with agents-sandbox worktree rm $n"
  fi
  g fetch -q --prune host >&2 || echo "warning: could not refresh the host's branches from $AS_HOST_GIT" >&2
  if [ ! -e "$wt/.git" ]; then
    g worktree prune
    mkdir -p "$(dirname "$wt")"
    g worktree add -q "$wt" "$branch" >&2 || fail 6 "could not check out $branch at $wt again"
  fi
else
  [ -n "$AS_BASE_COMMIT" ] || fail 3 "$AS_BASE_ERR"
  g fetch -q --prune host >&2 || fail 6 "could not fetch from the host repository at $AS_HOST_GIT"
  if ! g cat-file -e "$AS_BASE_COMMIT^{commit}" 2>/dev/null; then
    g fetch -q --no-tags host "$AS_BASE_COMMIT" >&2 || fail 4 "could not fetch $AS_BASE ($AS_BASE_COMMIT) from the host repository"
  fi
  if g show-ref -q --verify "refs/heads/$branch"; then
    fail 5 "the VM's repository already has a branch $branch without a session; remove it with agents-sandbox worktree rm $n, or pick another name"
  fi
  mkdir -p "$(dirname "$wt")"
  g worktree add -q --no-track -b "$branch" "$wt" "$AS_BASE_COMMIT" >&2 || fail 5 "could not create branch $branch at $wt (a branch agents-sandbox/$n/... or a parent of it may exist; pick another name)"
  g config "agents-sandbox.$n.base" "$AS_BASE"
  g config "agents-sandbox.$n.basecommit" "$AS_BASE_COMMIT"
  g config "agents-sandbox.$n.baseref" "$AS_BASE_REF"
  if [ -f "$wt/.gitmodules" ]; then
    (
      cd "$wt"
      git config -f .gitmodules --get-regexp '^submodule\..*\.path$' 2>/dev/null | while read -r key p; do
        name=${key#submodule.}; name=${name%.path}
        found=
        for d in $AS_MODULE_DIRS; do
          if [ -d "$d/modules/$name" ]; then
            git submodule init -- "$p" >/dev/null 2>&1 || true
            git config "submodule.$name.url" "$d/modules/$name"
            found=1; break
          fi
        done
        [ -n "$found" ] || echo "warning: submodule $p is not checked out on the host; it stays uninitialised (initialise it in the session with git submodule update --init $p)" >&2
      done
      git -c protocol.file.allow=always submodule update >/dev/null 2>&1 || echo "warning: some submodules could not be checked out from the host's submodule repositories; see git submodule status in the session" >&2
      git submodule foreach -q '[ ! -f .gitmodules ] || echo "warning: the nested submodules of $sm_path stay uninitialised"' >&2 2>/dev/null || true
    )
  fi
  echo created
fi
status_line "$n"
if [ -n "$AS_SUBDIR" ] && [ -d "$wt/$AS_SUBDIR" ]; then printf '%s\n' "$wt/$AS_SUBDIR"; else printf '%s\n' "$wt"; fi
`

// worktreeListScript prints the status line of every session, after a
// refresh from the host when AS_REFRESH is set.
const worktreeListScript = worktreePrelude + `
[ -f "$repo/HEAD" ] || exit 0
if [ -n "$AS_REFRESH" ] && [ -d "$AS_HOST_GIT" ]; then
  g fetch -q --prune host >&2 || echo "warning: could not refresh the host's branches from $AS_HOST_GIT" >&2
fi
g config --get-regexp '^agents-sandbox\..*\.basecommit$' | while read -r key _; do
  k=${key#agents-sandbox.}
  status_line "${k%.basecommit}"
done
`

// worktreeDiffScript prints a unified diff (git format, binary patches) of
// session AS_NAME against BASE: from the point where the session left BASE
// (their merge base) to the worktree as it is, commits, uncommitted changes
// and untracked files (not ignored ones) included. It stages into a
// temporary index, so the worktree's own index is not touched.
const worktreeDiffScript = worktreePrelude + `
n=$AS_NAME; wt=$AS_WORKTREES/$n
has_session "$n" || fail 4 "no worktree session $n in this VM; agents-sandbox worktree ls lists them"
[ -e "$wt/.git" ] || fail 4 "the worktree of session $n is gone; open the session again (--worktree $n) to check its branch out again"
cd "$wt"
bc=$(g config --get "agents-sandbox.$n.basecommit")
bref=$(g config --get "agents-sandbox.$n.baseref" || true)
tip=$bc
if [ -n "$bref" ] && t=$(g rev-parse -q --verify "$bref^{commit}"); then tip=$t; fi
mb=$(git merge-base "$tip" HEAD 2>/dev/null) || mb=$bc
idx=$(mktemp "${TMPDIR:-/tmp}/agents-sandbox-diff.XXXXXX")
trap 'rm -f "$idx"' EXIT
cp "$(git rev-parse --git-path index)" "$idx" 2>/dev/null || rm -f "$idx"
GIT_INDEX_FILE=$idx git add -A >/dev/null
GIT_INDEX_FILE=$idx git -c core.quotepath=off -c diff.noprefix=false -c diff.mnemonicPrefix=false diff --cached --binary --no-color --no-ext-diff --no-textconv "$mb"
`

// worktreeBundleScript writes a bundle of session AS_NAME's branch to
// AS_BUNDLE, leaving out what the host's branches have (as just fetched),
// and prints the branch's commit. When the host has every commit already,
// the bundle holds just the tip (its parents as prerequisites).
const worktreeBundleScript = worktreePrelude + `
n=$AS_NAME; br=refs/heads/agents-sandbox/$n
has_session "$n" || fail 4 "no worktree session $n in this VM; agents-sandbox worktree ls lists them"
head=$(g rev-parse -q --verify "$br^{commit}") || fail 4 "session $n has no branch agents-sandbox/$n"
[ ! -d "$AS_HOST_GIT" ] || g fetch -q --prune host >&2 || true
mkdir -p "$(dirname "$AS_BUNDLE")"
rm -f "$AS_BUNDLE"
if ! err=$(g bundle create -q "$AS_BUNDLE" "$br" --not --remotes=host 2>&1); then
  case $err in
  *empty*) g bundle create -q "$AS_BUNDLE" -1 "$br" >&2 ;;
  *) fail 6 "git bundle create: $err" ;;
  esac
fi
printf '%s\n' "$head"
`

// worktreeRemoveScript removes session AS_NAME: its worktree, its branch and
// its record. Without AS_FORCE it refuses (exit 5) a session with
// uncommitted changes, or with commits BASE does not have unless the host
// holds its branch at the same commit (AS_EXPORTED).
const worktreeRemoveScript = worktreePrelude + `
n=$AS_NAME; wt=$AS_WORKTREES/$n; br=agents-sandbox/$n
has_session "$n" || g show-ref -q --verify "refs/heads/$br" || fail 4 "no worktree session $n in this VM; agents-sandbox worktree ls lists them"
if [ -z "$AS_FORCE" ] && has_session "$n"; then
  status_line "$n" >/dev/null
  [ "$dirty" = 0 ] || fail 5 "session $n has uncommitted changes; commit and export them first, or remove it anyway with --force"
  if [ "$ahead" != 0 ] && [ "$head" != "$AS_EXPORTED" ]; then
    fail 5 "session $n has $ahead commit(s) that are not exported; run agents-sandbox worktree export $n first, or remove it anyway with --force"
  fi
fi
if [ -e "$wt/.git" ]; then g worktree remove --force --force "$wt" >&2 || rm -rf "$wt"; fi
rm -rf "$wt"
g worktree prune
g branch -q -D "$br" >/dev/null 2>&1 || true
g config --remove-section "agents-sandbox.$n" >/dev/null 2>&1 || true
`

// worktreeEnv is the environment of every in-VM worktree script.
func worktreeEnv(extra map[string]string) map[string]string {
	env := map[string]string{
		"AS_REPO":      WorktreeRepo,
		"AS_WORKTREES": WorktreesDir,
		"AS_HOST_GIT":  HostGitDir,
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// worktreeScript runs an in-VM worktree script as user and returns its
// standard output. Exit codes 3, 4 and 5 become ErrInvalid (with
// ErrBadWorktree), ErrNotFound and ErrConflict, quoting the script's last
// message; lines of standard error starting with "warning: " are returned as
// warnings.
func (m *Manager) worktreeScript(ctx context.Context, vm, user, what, script string, env map[string]string, stdout io.Writer) (warnings []string, err error) {
	var out bytes.Buffer
	if stdout == nil {
		stdout = &out
	}
	res, err := m.execIn(ctx, vm, user, HomeDir, ExecOptions{
		Cmd: []string{"sh", "-c", script, "agents-sandbox-worktree"}, Env: worktreeEnv(env),
		Stdout: stdout, OutputCap: 64 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var msgs []string
	for _, l := range strings.Split(res.Stderr.Text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "":
		case strings.HasPrefix(l, "warning: "):
			warnings = append(warnings, strings.TrimPrefix(l, "warning: "))
		default:
			msgs = append(msgs, l)
		}
	}
	msg := strings.Join(msgs, "; ")
	switch res.ExitCode {
	case 0:
		return warnings, nil
	case 3:
		return warnings, fmt.Errorf("%s: %w: %w: %s", what, ErrInvalid, ErrBadWorktree, msg)
	case 4:
		return warnings, fmt.Errorf("%s: %w: %s", what, ErrNotFound, msg)
	case 5:
		return warnings, fmt.Errorf("%s: %w: %s", what, ErrConflict, msg)
	}
	if res.TimedOut || res.Cancelled {
		return warnings, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return warnings, fmt.Errorf("%s: exit %d: %s", what, res.ExitCode, msg)
}

// parseSessionLine parses one status line of worktreePrelude's status_line.
func parseSessionLine(line string) (WorktreeSession, error) {
	f := strings.SplitN(line, "\t", 10)
	if len(f) != 10 {
		return WorktreeSession{}, fmt.Errorf("unexpected worktree status line %q", line)
	}
	ahead, err1 := strconv.Atoi(f[5])
	behind, err2 := strconv.Atoi(f[6])
	if err1 != nil || err2 != nil {
		return WorktreeSession{}, fmt.Errorf("unexpected worktree status line %q", line)
	}
	return WorktreeSession{
		Name: f[0], Branch: WorktreeBranchPrefix + f[0], Path: f[1], Head: f[2], BaseCommit: f[3], BaseRef: f[4],
		Ahead: ahead, Behind: behind, Dirty: f[7] == "1", Missing: f[8] == "1", Base: f[9],
	}, nil
}

// worktreeLock serialises the changes to the VM's private repository that
// agents-sandbox makes (opening, refreshing, bundling and removing
// sessions) per checkout and agent, also across processes. The sessions'
// own git commands are not serialised: git locks what they share.
func (m *Manager) worktreeLock(ctx context.Context, p *Project) (*Lock, error) {
	return AcquireLock(ctx, LockFile(p.Names.StateDir, "worktree-"+p.Names.Agent))
}

// hostGit runs git on the host for the project: in the caller's directory
// when it has a work tree, else with --git-dir at the git common dir (a
// bare checkout). It returns standard output (trimmed) and standard error.
func hostGit(ctx context.Context, p *Project, args ...string) (string, string, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return "", "", errGitMissing
	}
	full := append([]string{"-C", p.ID.Dir}, args...)
	if p.ID.WorkTree == "" {
		full = append([]string{"--git-dir=" + p.ID.GitCommonDir}, args...)
	}
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Dir = p.ID.Dir
	cmd.Env = append(gitEnv(os.Environ()), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C", "GIT_OPTIONAL_LOCKS=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()), err
}

// badBaseError is a BASE that names no commit: ErrInvalid and ErrBadWorktree,
// with a message that names the input and the fix.
type badBaseError struct{ spec, msg string }

func (e *badBaseError) Error() string {
	return fmt.Sprintf("worktree %s: %v: %v: %s", e.spec, ErrInvalid, ErrBadWorktree, e.msg)
}
func (e *badBaseError) Unwrap() []error { return []error{ErrInvalid, ErrBadWorktree} }

// worktreeBase is BASE resolved in the host checkout.
type worktreeBase struct {
	Spec   string // as given, "HEAD" by default
	Commit string
	Ref    string // VM ref following it (refs/remotes/host/X), or ""
}

// resolveWorktreeBase resolves spec's BASE (HEAD when empty) in the host
// checkout, from the caller's directory, with read-only git commands.
// Errors wrap ErrInvalid and ErrBadWorktree.
func resolveWorktreeBase(ctx context.Context, p *Project, spec WorktreeSpec) (worktreeBase, error) {
	b := worktreeBase{Spec: spec.Base}
	if b.Spec == "" {
		b.Spec = "HEAD"
	}
	commit, stderr, err := hostGit(ctx, p, "rev-parse", "--verify", "--quiet", b.Spec+"^{commit}")
	if err != nil || commit == "" {
		if errors.Is(err, errGitMissing) {
			return b, err
		}
		why := "no such branch, tag or commit in the checkout"
		if stderr != "" {
			why += " (" + stderr + ")"
		}
		if spec.Base == "" {
			return b, &badBaseError{spec.Name, fmt.Sprintf("the checkout's HEAD names no commit (no commits yet?); commit something first, or give a base as %s:BASE", spec.Name)}
		}
		return b, &badBaseError{spec.String(), fmt.Sprintf("BASE %q: %s; name an existing branch, tag or commit (git branch -a and git tag list them), e.g. %s:main", spec.Base, why, spec.Name)}
	}
	b.Commit = commit
	if full, _, err := hostGit(ctx, p, "rev-parse", "--symbolic-full-name", b.Spec); err == nil {
		if br, ok := strings.CutPrefix(full, "refs/heads/"); ok && br != "" {
			b.Ref = "refs/remotes/host/" + br
		}
	}
	return b, nil
}

// hostModuleDirs are the directories in the VM whose modules/ may hold the
// host's submodule repositories for the caller's worktree: its own git dir
// (a linked worktree keeps its submodules there), then the common dir.
func hostModuleDirs(ctx context.Context, p *Project) []string {
	dirs := []string{}
	if gd, _, err := hostGit(ctx, p, "rev-parse", "--absolute-git-dir"); err == nil && gd != "" {
		if real, err := filepath.EvalSymlinks(gd); err == nil {
			gd = real
		}
		if rel, err := filepath.Rel(p.ID.GitCommonDir, gd); err == nil && rel != "." && !strings.HasPrefix(rel, "..") && !strings.ContainsAny(rel, " \t\n") {
			dirs = append(dirs, path.Join(HostGitDir, filepath.ToSlash(rel)))
		}
	}
	return append(dirs, HostGitDir)
}

// needGit refuses a project that is not a git checkout.
func needGit(p *Project, what string) error {
	if !p.ID.Git || p.ID.GitCommonDir == "" {
		return fmt.Errorf("%s: %w: %w: %s is not a git checkout; worktree sessions need one", what, ErrInvalid, ErrNotCheckout, p.ID.ProjectDir)
	}
	return nil
}

// OpenWorktree creates session spec.Name in the project's VM (a stopped VM
// is started; a missing one is ErrNotFound), or continues it when it
// exists, and returns it with WorkDir set. A new session gets branch
// agents-sandbox/NAME at BASE (resolved in the host checkout from the
// caller's directory; HEAD by default), checked out at WorktreesDir/NAME,
// with its submodules initialised from the host's. The host checkout and
// its .git are only read.
//
// Errors: ErrInvalid with ErrBadWorktree for an invalid NAME or a BASE that
// does not exist; ErrConflict when the session exists with another BASE;
// ErrNotFound when the VM does not exist or predates worktree support;
// ErrInvalid with ErrNotCheckout outside a git checkout.
func (m *Manager) OpenWorktree(ctx context.Context, p *Project, spec WorktreeSpec) (WorktreeSession, error) {
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return WorktreeSession{}, err
	}
	return m.openWorktreeIn(ctx, p, vm, user, spec)
}

// openWorktreeIn is OpenWorktree in a given running VM (the project VM, or
// a task sandbox that mounts the project's home volume).
func (m *Manager) openWorktreeIn(ctx context.Context, p *Project, vm, user string, spec WorktreeSpec) (WorktreeSession, error) {
	what := "worktree " + spec.Name
	if err := needGit(p, what); err != nil {
		return WorktreeSession{}, err
	}
	if err := CheckWorktreeName(spec.Name); err != nil {
		return WorktreeSession{}, err
	}
	t0 := time.Now()
	base, baseErr := resolveWorktreeBase(ctx, p, spec)
	if baseErr != nil && (spec.Base != "" || errors.Is(baseErr, errGitMissing)) {
		return WorktreeSession{}, baseErr
	}
	baseErrText := ""
	var bb *badBaseError
	if errors.As(baseErr, &bb) {
		baseErrText = bb.msg
	} else if baseErr != nil {
		return WorktreeSession{}, baseErr
	}
	subdir := ""
	if p.ID.WorkTree != "" {
		if rel, err := filepath.Rel(p.ID.WorkTree, p.ID.Dir); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			subdir = filepath.ToSlash(rel)
		}
	}
	modules := hostModuleDirs(ctx, p)

	lock, err := m.worktreeLock(ctx, p)
	if err != nil {
		return WorktreeSession{}, fmt.Errorf("%s: %w", what, err)
	}
	defer lock.Unlock()
	rootEnv := map[string]string{"AS_NAME": spec.Name, "AS_MODULE_DIRS": strings.Join(modules, " ")}
	if _, err := m.worktreeScript(ctx, vm, "0:0", what+": let git read "+HostGitDir, worktreeRootScript, rootEnv, nil); err != nil {
		return WorktreeSession{}, err
	}
	given := ""
	if spec.Base != "" {
		given = "1"
	}
	// The host repository's commit identity, so that the agent can commit
	// in the session (read only; a git identity set inside the VM wins).
	userName, _, _ := hostGit(ctx, p, "config", "--get", "user.name")
	userEmail, _, _ := hostGit(ctx, p, "config", "--get", "user.email")
	var out bytes.Buffer
	warnings, err := m.worktreeScript(ctx, vm, user, what, worktreeOpenScript, map[string]string{
		"AS_NAME": spec.Name, "AS_BASE": base.Spec, "AS_BASE_GIVEN": given, "AS_BASE_COMMIT": base.Commit,
		"AS_BASE_REF": base.Ref, "AS_BASE_ERR": baseErrText, "AS_SUBDIR": subdir, "AS_MODULE_DIRS": strings.Join(modules, " "),
		"AS_USER_NAME": strings.TrimSpace(userName), "AS_USER_EMAIL": strings.TrimSpace(userEmail),
	}, &out)
	if err != nil {
		return WorktreeSession{}, err
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	created := false
	if len(lines) > 0 && lines[0] == "created" {
		created, lines = true, lines[1:]
	}
	if len(lines) != 2 {
		return WorktreeSession{}, fmt.Errorf("%s: unexpected output %q", what, out.String())
	}
	s, err := parseSessionLine(lines[0])
	if err != nil {
		return WorktreeSession{}, fmt.Errorf("%s: %w", what, err)
	}
	s.WorkDir, s.Created, s.Warnings = lines[1], created, warnings
	for _, w := range warnings {
		m.Log.Warn().Str("worktree", spec.Name).Msg(w)
	}
	m.Log.Debug().Str("worktree", spec.Name).Bool("created", created).Dur("took", time.Since(t0)).Msg("worktree session ready")
	return s, nil
}

// WorktreeListOptions tune Worktrees.
type WorktreeListOptions struct {
	// Refresh fetches the host's branches into the VM's private repository
	// first, so Behind counts against BASE as the host has it now.
	Refresh bool
	// NoStart lists nothing (and no error) when the VM is not running,
	// instead of starting it.
	NoStart bool
}

// Worktrees lists the worktree sessions in the project's VM, sorted by
// name, with their branch, base, ahead/behind counts and dirty state. A
// stopped VM is started (unless NoStart). Errors: ErrNotFound when the VM
// does not exist.
func (m *Manager) Worktrees(ctx context.Context, p *Project, o WorktreeListOptions) ([]WorktreeSession, error) {
	if o.NoStart {
		name, vm, err := m.findVM(ctx, p)
		if err != nil {
			if isNotFound(err) {
				return nil, nil
			}
			return nil, err
		}
		if vm.State != VMRunning {
			return nil, nil
		}
		user := vm.Labels[labelUser]
		if user == "" {
			user = "dev"
		}
		return m.listWorktreesIn(ctx, p, name, user, o.Refresh)
	}
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return nil, err
	}
	return m.listWorktreesIn(ctx, p, vm, user, o.Refresh)
}

func (m *Manager) listWorktreesIn(ctx context.Context, p *Project, vm, user string, refresh bool) ([]WorktreeSession, error) {
	env := map[string]string{"AS_REFRESH": ""}
	if refresh {
		lock, err := m.worktreeLock(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("list worktrees: %w", err)
		}
		defer lock.Unlock()
		env["AS_REFRESH"] = "1"
	}
	var out bytes.Buffer
	warnings, err := m.worktreeScript(ctx, vm, user, "list worktrees", worktreeListScript, env, &out)
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		m.Log.Warn().Msg(w)
	}
	var sessions []WorktreeSession
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		s, err := parseSessionLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("list worktrees: %w", err)
		}
		sessions = append(sessions, s)
	}
	sortSessions(sessions)
	return sessions, nil
}

func sortSessions(s []WorktreeSession) {
	sort.Slice(s, func(i, j int) bool { return s[i].Name < s[j].Name })
}

// worktreeSession returns session name from the VM's list (ErrNotFound
// when there is none by that name).
func (m *Manager) worktreeSession(ctx context.Context, p *Project, vm, user, name string) (WorktreeSession, error) {
	list, err := m.listWorktreesIn(ctx, p, vm, user, false)
	if err != nil {
		return WorktreeSession{}, err
	}
	for _, s := range list {
		if s.Name == name {
			return s, nil
		}
	}
	return WorktreeSession{}, fmt.Errorf("worktree %s: %w: no such session in %s; agents-sandbox worktree ls lists them", name, ErrNotFound, vm)
}

// WorktreeDiff writes to w a unified diff (git format, a/ and b/ prefixes,
// binary patches) of session name against its BASE: from where the session
// left BASE to its worktree as it is now, committed, uncommitted and
// untracked (not ignored) changes included; `git apply` takes it in a
// checkout at BASE. It returns the session. The worktree's own index is not
// changed. Errors: ErrNotFound for no such session or VM.
func (m *Manager) WorktreeDiff(ctx context.Context, p *Project, name string, w io.Writer) (WorktreeSession, error) {
	if err := CheckWorktreeName(name); err != nil {
		return WorktreeSession{}, err
	}
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return WorktreeSession{}, err
	}
	s, err := m.worktreeSession(ctx, p, vm, user, name)
	if err != nil {
		return s, err
	}
	if _, err := m.worktreeScript(ctx, vm, user, "worktree diff "+name, worktreeDiffScript, map[string]string{"AS_NAME": name}, w); err != nil {
		return s, err
	}
	return s, nil
}

// ExportOptions tune ExportWorktree.
type ExportOptions struct {
	// Force replaces the host's agents-sandbox/NAME even when the session's
	// branch does not contain it (the session was rebased since the last
	// export).
	Force bool
}

// ExportResult says what ExportWorktree did to the host repository.
type ExportResult struct {
	Session WorktreeSession `json:"session"`
	// Ref is the host branch written (refs/heads/agents-sandbox/NAME).
	Ref string `json:"ref"`
	// Commit is the commit it points to now, the session branch's.
	Commit string `json:"commit"`
	// Previous is what it pointed to before ("" when it was new).
	Previous string `json:"previous,omitempty"`
	// Updated is false when the host branch was already at Commit.
	Updated bool `json:"updated"`
	// Uncommitted warns that the worktree has changes that were not
	// exported (only commits are).
	Uncommitted bool  `json:"uncommitted"`
	DurationMS  int64 `json:"duration_ms"`
}

// ExportWorktree fetches session name's branch into the host repository as
// agents-sandbox/NAME, with the exact commits of the session (same ids). It
// is the only operation that writes to the host's .git: a bundle of the
// branch (without what the host has) is made in the VM, copied out, and
// fetched from on the host with `git fetch`. Only commits are exported;
// Uncommitted says the worktree has more.
//
// Errors: ErrNotFound for no such session or VM; ErrConflict when the host
// branch has commits the session's does not (use Force) or is checked out
// in a host worktree.
func (m *Manager) ExportWorktree(ctx context.Context, p *Project, name string, o ExportOptions) (ExportResult, error) {
	t0 := time.Now()
	what := "worktree export " + name
	res := ExportResult{Ref: "refs/heads/" + WorktreeBranchPrefix + name}
	if err := needGit(p, what); err != nil {
		return res, err
	}
	if err := CheckWorktreeName(name); err != nil {
		return res, err
	}
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return res, err
	}
	s, err := m.worktreeSession(ctx, p, vm, user, name)
	if err != nil {
		return res, err
	}
	res.Session, res.Uncommitted = s, s.Dirty
	if prev, _, err := hostGit(ctx, p, "rev-parse", "--verify", "--quiet", res.Ref+"^{commit}"); err == nil {
		res.Previous = prev
	}

	bundle := fmt.Sprintf("%s/.agents-sandbox/export-%s.bundle", HomeDir, newSessionID())
	var out bytes.Buffer
	err = func() error {
		lock, err := m.worktreeLock(ctx, p)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer lock.Unlock()
		_, err = m.worktreeScript(ctx, vm, user, what+": bundle", worktreeBundleScript, map[string]string{"AS_NAME": name, "AS_BUNDLE": bundle}, &out)
		return err
	}()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = m.RT.Exec(rctx, vm, ExecRequest{Cmd: []string{"rm", "-f", bundle}, User: user})
	}()
	if err != nil {
		return res, err
	}
	res.Commit = strings.TrimSpace(out.String())
	if res.Commit == res.Previous {
		res.DurationMS = time.Since(t0).Milliseconds()
		return res, nil
	}

	tmp, err := os.MkdirTemp("", "agents-sandbox-export-*")
	if err != nil {
		return res, fmt.Errorf("%s: %w", what, err)
	}
	defer os.RemoveAll(tmp)
	local := filepath.Join(tmp, "session.bundle")
	if err := m.copyFileOut(ctx, vm, bundle, local); err != nil {
		return res, fmt.Errorf("%s: copy the bundle out of %s: %w", what, vm, err)
	}
	refspec := res.Ref + ":" + res.Ref
	if o.Force {
		refspec = "+" + refspec
	}
	fetch := func(extra ...string) (string, error) {
		args := append([]string{"--git-dir=" + p.ID.GitCommonDir, "fetch", "--no-tags", "--no-progress"}, extra...)
		args = append(args, local, refspec)
		_, stderr, err := hostGit(ctx, p, args...)
		return stderr, err
	}
	stderr, err := fetch("--no-write-fetch-head")
	if err != nil && strings.Contains(stderr, "no-write-fetch-head") {
		stderr, err = fetch() // git before 2.29
	}
	if err != nil {
		switch {
		case strings.Contains(stderr, "non-fast-forward") || strings.Contains(stderr, "[rejected]"):
			return res, fmt.Errorf("%s: %w: the host's %s has commits the session's branch does not (was the session rebased since the last export?); export again with --force to replace it: %s", what, ErrConflict, strings.TrimPrefix(res.Ref, "refs/heads/"), stderr)
		case strings.Contains(stderr, "checked out") || strings.Contains(stderr, "refusing to fetch"):
			return res, fmt.Errorf("%s: %w: %s is checked out in a host worktree; switch that worktree to another branch first: %s", what, ErrConflict, strings.TrimPrefix(res.Ref, "refs/heads/"), stderr)
		}
		return res, fmt.Errorf("%s: git fetch from the bundle: %w: %s", what, err, stderr)
	}
	now, _, err := hostGit(ctx, p, "rev-parse", "--verify", "--quiet", res.Ref+"^{commit}")
	if err != nil || now != res.Commit {
		return res, fmt.Errorf("%s: the host's %s is %q after the fetch, want %s", what, res.Ref, now, res.Commit)
	}
	res.Updated = true
	res.DurationMS = time.Since(t0).Milliseconds()
	return res, nil
}

// copyFileOut copies the regular file at src in vm to dst on the host.
func (m *Manager) copyFileOut(ctx context.Context, vm, src, dst string) error {
	rc, err := m.RT.CopyFrom(ctx, vm, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: no regular file in the copy", src)
		}
		if err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
}

// RemoveWorktreeOptions tune RemoveWorktree.
type RemoveWorktreeOptions struct {
	// Force removes a session with uncommitted changes or unexported
	// commits.
	Force bool
}

// RemoveWorktree removes session name from the project's VM: its worktree,
// its branch in the VM and its record. The host repository is not touched
// (an exported agents-sandbox/NAME stays). Without Force it refuses, with
// ErrConflict, a session with uncommitted changes or with commits that the
// host's agents-sandbox/NAME does not point to. Errors: ErrNotFound for no
// such session or VM.
func (m *Manager) RemoveWorktree(ctx context.Context, p *Project, name string, o RemoveWorktreeOptions) error {
	what := "worktree rm " + name
	if err := CheckWorktreeName(name); err != nil {
		return err
	}
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return err
	}
	exported := ""
	if p.ID.Git {
		if c, _, err := hostGit(ctx, p, "rev-parse", "--verify", "--quiet", "refs/heads/"+WorktreeBranchPrefix+name+"^{commit}"); err == nil {
			exported = c
		}
	}
	force := ""
	if o.Force {
		force = "1"
	}
	lock, err := m.worktreeLock(ctx, p)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer lock.Unlock()
	_, err = m.worktreeScript(ctx, vm, user, what, worktreeRemoveScript, map[string]string{"AS_NAME": name, "AS_FORCE": force, "AS_EXPORTED": exported}, nil)
	return err
}

// worktreeExec prepares a command of session spec in vm: it opens the
// session and returns the directory the command starts in (dir when set)
// and env with the session's variables added.
func (m *Manager) worktreeExec(ctx context.Context, p *Project, vm, user, spec, dir string, env map[string]string) (string, map[string]string, error) {
	ws, err := ParseWorktreeSpec(spec)
	if err != nil {
		return "", nil, err
	}
	s, err := m.openWorktreeIn(ctx, p, vm, user, ws)
	if err != nil {
		return "", nil, err
	}
	out := map[string]string{"AGENTS_SANDBOX_WORKTREE": s.Name, "GIT_LFS_SKIP_SMUDGE": "1"}
	for k, v := range env {
		out[k] = v
	}
	if dir == "" {
		dir = s.WorkDir
	}
	return dir, out, nil
}

// checkWorktreeTask checks a task's Worktree against its other options and
// makes its workspace none.
func checkWorktreeTask(p *Project, o *TaskOptions) error {
	if o.Worktree == "" {
		return nil
	}
	if _, err := ParseWorktreeSpec(o.Worktree); err != nil {
		return err
	}
	if err := needGit(p, "task worktree "+o.Worktree); err != nil {
		return err
	}
	if o.Workspace != "" && o.Workspace != WorkspaceNone {
		return fmt.Errorf("task: %w: workspace %q and worktree %q exclude each other: a worktree task works in its session's worktree; leave workspace unset", ErrInvalid, o.Workspace, o.Worktree)
	}
	if o.Home != "" {
		return fmt.Errorf("task: %w: home %q and worktree %q exclude each other: a worktree task mounts the project's home volume, where the session lives; leave home unset", ErrInvalid, o.Home, o.Worktree)
	}
	o.Workspace = WorkspaceNone
	return nil
}

// worktreeTaskHome returns the project VM's home volume, which a worktree
// task mounts read-write (ErrNotFound when there is none yet: the engine
// would make a missing volume, empty, on mount).
func (m *Manager) worktreeTaskHome(ctx context.Context, p *Project) (string, error) {
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return "", err
	}
	as := st.Agents[p.Names.Agent]
	if as == nil || as.HomeVolume == "" {
		return "", fmt.Errorf("task worktree: %w: the project VM has no home volume yet (worktree sessions live there); create the VM first (agents-sandbox create, or sandbox_create)", ErrNotFound)
	}
	if _, err := m.RT.InspectVolume(ctx, as.HomeVolume); isNotFound(err) {
		return "", fmt.Errorf("task worktree: the project VM's home volume %q: %w; create the VM again", as.HomeVolume, ErrNotFound)
	} else if err != nil {
		return "", fmt.Errorf("task worktree: inspect home volume %q: %w", as.HomeVolume, err)
	}
	return as.HomeVolume, nil
}

// worktreeTaskResult is the session of a worktree task after its command.
func (m *Manager) worktreeTaskResult(ctx context.Context, p *Project, vm, user, spec string) (*WorktreeSession, error) {
	ws, err := ParseWorktreeSpec(spec)
	if err != nil {
		return nil, err
	}
	s, err := m.worktreeSession(ctx, p, vm, user, ws.Name)
	if err != nil {
		return nil, err
	}
	return &s, nil
}
