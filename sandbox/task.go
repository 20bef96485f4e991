package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// WorkspaceMode says how a task sandbox sees the checkout.
type WorkspaceMode string

// Workspace modes.
const (
	WorkspaceCopy  WorkspaceMode = "copy"  // a private copy at /workspace (default)
	WorkspaceMount WorkspaceMode = "mount" // the host checkout, read-write
	WorkspaceNone  WorkspaceMode = "none"  // an empty /workspace
)

// HomeMode says what a task sandbox gets as /home/dev.
type HomeMode string

// Home modes.
const (
	HomeFresh    HomeMode = "fresh"    // the image's /home/dev (default)
	HomeReadOnly HomeMode = "readonly" // the project VM's home volume, mounted read-only
)

// Task labels beyond the common ones.
const (
	labelSpawnerPID  = "org.agents-sandbox.spawner-pid"
	labelSpawnerHost = "org.agents-sandbox.spawner-host"
	labelTimeout     = "org.agents-sandbox.timeout"
	labelKeep        = "org.agents-sandbox.keep" // "true": kept after it ended, for prune to remove
)

// TaskOptions is one task sandbox run.
type TaskOptions struct {
	// Cmd is the command to run, in the caller's place under /workspace.
	// When empty, the agent's headless command runs with AgentArgs appended
	// (for a `sh -c`-style headless command, AgentArgs joined with spaces
	// become its script).
	Cmd       []string
	AgentArgs []string
	// Env is set for the command, over the project's configured env.
	Env map[string]string
	// Timeout bounds the command (not the image build or the sandbox's
	// start): when it passes, the command's whole process group is killed,
	// ExitCode is 124 and TimedOut is set. 0: no timeout.
	Timeout   time.Duration
	Workspace WorkspaceMode // default copy
	Home      HomeMode      // default fresh
	// Keep leaves the sandbox behind, stopped, for inspection; `prune`
	// removes it.
	Keep bool
	// OutputCap bounds the bytes kept of each of stdout and stderr
	// (DefaultOutputCap when 0); the rest is counted, not kept.
	OutputCap int
	Resources *Resources // nil: the project's
	// Stdout and Stderr, when set, also receive the full streams as they
	// come.
	Stdout, Stderr io.Writer
	// Progress receives image build output; may be nil.
	Progress ProgressFunc
	// Worktree, when set ("NAME[:BASE]"), runs the command in that worktree
	// session (made when missing, see OpenWorktree). The session lives on
	// the project VM's home volume, which the task then mounts read-write
	// as its home (it must exist: create the VM first); Workspace must be
	// unset or none and Home unset. The result's Worktree is the session
	// after the command.
	Worktree string
}

// TaskResult is how a task ended. Diff and Changed are set for copy
// workspaces: Changed lists the paths (relative to the checkout root, sorted)
// whose content, type or executable bit the task changed, created or
// deleted; Diff is a unified diff of them in git format (a/ and b/
// prefixes, binary patches for files that are not UTF-8 text) that
// `git apply` takes in the checkout. Neither covers .git directories, empty
// directories or mode bits other than the executable bit. DiffTruncated
// says Diff was cut (at a file boundary) at 8 MiB. Name is set once the
// sandbox was created; Kept says it was left behind, stopped.
type TaskResult struct {
	Name          string   `json:"name"`
	Kept          bool     `json:"kept"`
	ExitCode      int      `json:"exit_code"`
	Stdout        Output   `json:"stdout"`
	Stderr        Output   `json:"stderr"`
	TimedOut      bool     `json:"timed_out"`
	DurationMS    int64    `json:"duration_ms"`
	Workspace     string   `json:"workspace"`
	Changed       []string `json:"changed,omitempty"`
	Diff          string   `json:"diff,omitempty"`
	DiffTruncated bool     `json:"diff_truncated,omitempty"`
	// Worktree is the worktree session after the command (Worktree tasks).
	Worktree *WorktreeSession `json:"worktree,omitempty"`
}

// maxDiff bounds the diff returned in a TaskResult (8 MiB).
const maxDiff = 8 << 20

// SpawnTask runs one command in a new, short-lived sandbox made from the
// checkout's runner image (built first if needed), named
// `<checkout-slug>-<agent>-<unix-nanos>` and labelled kind=task with the
// spawning process's pid and host, then removes it (unless Keep). The task
// gets the project VM's env, mounts, network policy, proxy and secret
// placeholders, but never the project VM itself nor its home volume (unless
// Home is readonly, which mounts that volume read-only); a fresh home is
// provisioned like the VM's (agent config, [home] mappings; no startup
// hooks). A copy workspace is a snapshot of the checkout taken before the
// task starts; the host checkout is only read.
//
// It is safe to call concurrently, also from several processes: every task
// gets its own name and its own copy. A non-zero exit is a result, not an
// error. Errors: ErrInvalid for bad options or no command; ErrNotFound for
// Home readonly without a project home volume; image build, engine and
// diff failures, wrapped with the step. When ctx ends, the command is
// killed (ExitCode 130) and the sandbox removed (stopped with Keep); the
// error is ctx's.
func (m *Manager) SpawnTask(ctx context.Context, p *Project, o TaskOptions) (TaskResult, error) {
	if err := checkWorktreeTask(p, &o); err != nil {
		return TaskResult{Workspace: string(o.Workspace)}, err
	}
	res := TaskResult{Workspace: string(o.Workspace)}
	if o.Workspace == "" {
		o.Workspace = WorkspaceCopy
		res.Workspace = string(WorkspaceCopy)
	}
	switch o.Workspace {
	case WorkspaceCopy, WorkspaceMount, WorkspaceNone:
	default:
		return res, fmt.Errorf("workspace %q: %w: use copy, mount or none", o.Workspace, ErrInvalid)
	}
	switch o.Home {
	case "", HomeFresh, HomeReadOnly:
	default:
		return res, fmt.Errorf("home %q: %w: use fresh or readonly", o.Home, ErrInvalid)
	}
	cmd := o.Cmd
	if len(cmd) == 0 {
		if len(p.Agent.Headless) == 0 {
			return res, fmt.Errorf("task: %w: give a command, or use an agent with a headless command", ErrInvalid)
		}
		cmd = append(append([]string{}, p.Agent.Headless...), o.AgentArgs...)
		if isShellC(p.Agent.Headless) && len(o.AgentArgs) > 1 {
			cmd = append(append([]string{}, p.Agent.Headless...), strings.Join(o.AgentArgs, " "))
		}
	}
	if err := m.checkOCIRuntime(ctx, p); err != nil {
		return res, err
	}

	// The image, and the same egress as the project VM (same proxy,
	// placeholders, policy), under the checkout's lock: concurrent spawns
	// then build a missing image once and the others reuse it.
	var img imageState
	var eg egress
	{
		lock, err := m.lockVM(ctx, p)
		if err != nil {
			return res, err
		}
		img, err = m.ensureImage(ctx, p, CreateOptions{Progress: o.Progress})
		if err != nil {
			lock.Unlock()
			return res, err
		}
		st, err := LoadState(p.Names.StateDir)
		if err != nil {
			lock.Unlock()
			return res, err
		}
		as := st.Agent(p.Names.Agent)
		eg, err = m.ensureEgress(ctx, p, as)
		if err == nil {
			err = SaveState(p.Names.StateDir, st)
		}
		if err == nil && eg.Proxy && !m.proxyRunning(ctx, p) {
			err = m.startProxy(ctx, p, as)
		}
		lock.Unlock()
		if err != nil {
			return res, err
		}
	}

	spec, _, err := m.vmSpec(p, img, "", eg)
	if err != nil {
		return res, err
	}
	spec.Labels = p.ID.Labels(p.Names.Agent, KindTask)
	spec.Labels[LabelDir] = p.ID.ProjectDir
	spec.Labels[labelUser] = img.User
	spec.Labels[labelSpawnerPID] = strconv.Itoa(os.Getpid())
	host, _ := os.Hostname()
	spec.Labels[labelSpawnerHost] = host
	if o.Timeout > 0 {
		spec.Labels[labelTimeout] = o.Timeout.String()
	}
	if o.Keep {
		spec.Labels[labelKeep] = "true"
	}
	// A backstop: a task whose spawner died stops itself once idle.
	spec.Entrypoint = []string{InitPath, "vm-init", "--idle-timeout", "2m"}
	var mounts []MountSpec
	for _, mt := range spec.Mounts {
		switch mt.Target {
		case Workspace:
			if o.Workspace == WorkspaceMount {
				mounts = append(mounts, mt)
			}
		case HomeDir:
			if o.Worktree != "" {
				vol, err := m.worktreeTaskHome(ctx, p)
				if err != nil {
					return res, err
				}
				mounts = append(mounts, MountSpec{Type: "volume", Source: vol, Target: HomeDir, NoCopy: true})
			} else if o.Home == HomeReadOnly {
				st, err := LoadState(p.Names.StateDir)
				if err != nil {
					return res, err
				}
				as := st.Agents[p.Names.Agent]
				if as == nil || as.HomeVolume == "" {
					return res, fmt.Errorf("home readonly: %w: the project VM has no home volume yet; create it first", ErrNotFound)
				}
				// The engine would make a missing volume, empty, on mount.
				if _, err := m.RT.InspectVolume(ctx, as.HomeVolume); isNotFound(err) {
					return res, fmt.Errorf("home readonly: the project VM's home volume %q: %w; create the VM again", as.HomeVolume, ErrNotFound)
				} else if err != nil {
					return res, fmt.Errorf("home readonly: inspect home volume %q: %w", as.HomeVolume, err)
				}
				mounts = append(mounts, MountSpec{Type: "volume", Source: as.HomeVolume, Target: HomeDir, ReadOnly: true, NoCopy: true})
			}
		default:
			mounts = append(mounts, mt)
		}
	}
	spec.Mounts = mounts
	if o.Resources != nil {
		spec.CPUs, spec.PidsLimit = o.Resources.CPUs, o.Resources.Pids
		if o.Resources.Memory != "" {
			mem, err := ParseBytes(o.Resources.Memory)
			if err != nil {
				return res, fmt.Errorf("resources.memory: %w: %w", ErrInvalid, err)
			}
			spec.MemoryBytes = mem
		}
	}

	// Snapshot the checkout for a copy workspace before anything starts.
	var snapshot *os.File
	if o.Workspace == WorkspaceCopy {
		snapshot, err = os.CreateTemp("", "agents-sandbox-task-*.tar")
		if err != nil {
			return res, fmt.Errorf("task snapshot: %w", err)
		}
		defer os.Remove(snapshot.Name())
		defer snapshot.Close()
		if err := tarDir(snapshot, p.ID.ProjectDir, "workspace/", m.HostUID, m.HostGID); err != nil {
			return res, fmt.Errorf("task snapshot of %s: %w", p.ID.ProjectDir, err)
		}
	}

	// Create under a unique name; on a collision (two spawns in the same
	// nanosecond, or a Manager.Now that returns a fixed time) retry with a
	// random offset of up to a second.
	var name string
	for i := 0; ; i++ {
		t := m.now()
		if i > 0 {
			t = t.Add(time.Duration(rand.Int64N(int64(time.Second))))
		}
		name = p.Names.TaskName(t)
		spec.Name = name
		_, err = m.RT.CreateVM(ctx, spec)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrConflict) || i >= 10 {
			return res, fmt.Errorf("create task sandbox: %w", err)
		}
	}
	res.Name = name
	cleanup := func() {
		if o.Keep {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			_ = m.RT.StopVM(sctx, name, 2*time.Second)
			cancel()
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := m.RT.RemoveVM(rctx, name, true); err != nil && !isNotFound(err) {
			m.Log.Warn().Err(err).Str("task", name).Msg("could not remove task sandbox; `agents-sandbox prune` will")
		}
	}
	defer cleanup()
	res.Kept = o.Keep

	tr, err := initTar(m.InitBinary)
	if err != nil {
		return res, err
	}
	defer tr.Close()
	if err := m.RT.CopyTo(ctx, name, "/", tr); err != nil {
		return res, fmt.Errorf("copy init binary into task %q: %w", name, err)
	}
	if snapshot != nil {
		if _, err := snapshot.Seek(0, io.SeekStart); err != nil {
			return res, err
		}
		if err := m.RT.CopyTo(ctx, name, "/", snapshot); err != nil {
			return res, fmt.Errorf("copy checkout into task %q: %w", name, err)
		}
	}
	if err := m.RT.StartVM(ctx, name); err != nil {
		return res, fmt.Errorf("start task %q: %w", name, err)
	}
	if err := m.waitReady(ctx, name); err != nil {
		return res, err
	}
	if eg.Proxy {
		if err := m.installProxyCA(ctx, p, name); err != nil {
			return res, err
		}
	}
	if o.Home != HomeReadOnly && o.Worktree == "" {
		if err := m.provisionTask(ctx, p, name, img.User); err != nil {
			return res, err
		}
	}
	// The caller's place in the checkout; an empty workspace has none.
	dir := workdirFor(p)
	if o.Workspace == WorkspaceNone {
		dir = Workspace
	}
	env := o.Env
	if o.Worktree != "" {
		if dir, env, err = m.worktreeExec(ctx, p, name, img.User, o.Worktree, "", o.Env); err != nil {
			return res, err
		}
	}
	er, err := m.execIn(ctx, name, img.User, dir, ExecOptions{Cmd: cmd, Env: env, Timeout: o.Timeout, OutputCap: o.OutputCap, Stdout: o.Stdout, Stderr: o.Stderr})
	res.ExitCode, res.Stdout, res.Stderr, res.TimedOut, res.DurationMS = er.ExitCode, er.Stdout, er.Stderr, er.TimedOut, er.DurationMS
	if err != nil {
		return res, err
	}
	if o.Worktree != "" && ctx.Err() == nil {
		if res.Worktree, err = m.worktreeTaskResult(ctx, p, name, img.User, o.Worktree); err != nil {
			return res, err
		}
	}
	if snapshot != nil && ctx.Err() == nil {
		// Stop the task first: nothing it left running can change the
		// workspace while it is copied out.
		if err := m.RT.KillVM(ctx, name); err != nil && !isNotFound(err) && !errors.Is(err, ErrConflict) {
			return res, fmt.Errorf("stop task %q before diffing: %w", name, err)
		}
		if _, err := m.RT.WaitVM(ctx, name); err != nil {
			return res, fmt.Errorf("stop task %q before diffing: %w", name, err)
		}
		changed, diff, trunc, err := m.taskDiff(ctx, name, snapshot.Name())
		if err != nil {
			return res, err
		}
		res.Changed, res.Diff, res.DiffTruncated = changed, diff, trunc
	}
	return res, ctx.Err()
}

// provisionTask gives a task's fresh home what provisioning gives the
// project VM's: the agent's merged config and the [home] mappings. Startup
// hooks do not run in tasks.
func (m *Manager) provisionTask(ctx context.Context, p *Project, vm, user string) error {
	plan, err := m.provisionPlan(p)
	if err != nil {
		return err
	}
	for _, w := range plan.Warnings {
		m.Log.Warn().Str("task", vm).Msg("provision: " + w.String())
	}
	if len(plan.Files) == 0 && len(plan.Remove) == 0 {
		return nil
	}
	if len(plan.Remove) > 0 {
		args := []string{"rm", "-rf", "--"}
		for _, r := range plan.Remove {
			args = append(args, HomeDir+"/"+r)
		}
		var stderr bytes.Buffer
		r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: args, User: "0:0", Stderr: &stderr})
		if err != nil {
			return fmt.Errorf("provision task %q: remove shadowing files: %w", vm, err)
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("provision task %q: remove shadowing files: exit %d: %s", vm, r.ExitCode, strings.TrimSpace(stderr.String()))
		}
	}
	uid, gid, err := m.userIDs(ctx, vm, user)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := plan.Tar(&buf, uid, gid); err != nil {
		return fmt.Errorf("provision task %q: %w", vm, err)
	}
	if err := m.RT.CopyTo(ctx, vm, HomeDir, &buf); err != nil {
		return fmt.Errorf("provision task %q: copy files in: %w", vm, err)
	}
	return nil
}

// taskDiff compares the task's /workspace with the snapshot it started from.
// The task's VM is stopped by then, so its workspace cannot change under the
// copy. Both trees are unpacked on the host (without any .git directory:
// repository internals are not part of the result), staged into a throwaway
// git index, and compared with git diff-index, so paths come out with a/ and
// b/ prefixes relative to the checkout root and `git apply` takes the diff
// as it is. Files whose content is not valid UTF-8 get binary patches, so the
// diff survives JSON. The diff is cut at a file boundary when longer than
// maxDiff (truncated is then true; changed still lists every path).
func (m *Manager) taskDiff(ctx context.Context, name, snapshot string) (changed []string, diff string, truncated bool, err error) {
	tmp, err := os.MkdirTemp("", "agents-sandbox-diff-*")
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	defer os.RemoveAll(tmp)
	base, result, gitDir := filepath.Join(tmp, "a"), filepath.Join(tmp, "b"), filepath.Join(tmp, "git")
	f, err := os.Open(snapshot)
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	err = extractTree(f, base, "workspace/")
	f.Close()
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: unpack snapshot: %w", err)
	}
	rc, err := m.RT.CopyFrom(ctx, name, Workspace+"/.")
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: copy /workspace out of %q: %w", name, err)
	}
	err = extractTree(rc, result, "")
	rc.Close()
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: unpack result: %w", err)
	}

	git := func(workTree string, args ...string) ([]byte, error) {
		full := append([]string{"--git-dir=" + gitDir}, args...)
		if workTree != "" {
			full = append([]string{"--work-tree=" + workTree}, full...)
		}
		cmd := exec.CommandContext(ctx, "git", full...)
		cmd.Dir = tmp
		cmd.Env = hostGitEnv()
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
		}
		return out.Bytes(), nil
	}
	if _, err := git("", "init", "-q"); err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	// The checkout's own .gitattributes must not convert line endings or
	// run filters: the diff is of the bytes as they are.
	attrs := filepath.Join(gitDir, "info", "attributes")
	if err := os.MkdirAll(filepath.Dir(attrs), 0o755); err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	rules := "* -text -eol -filter -ident -working-tree-encoding\n"
	if err := os.WriteFile(attrs, []byte(rules), 0o644); err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	if _, err := git(base, "add", "-A", "-f", "--", "."); err != nil {
		return nil, "", false, fmt.Errorf("task diff: stage snapshot: %w", err)
	}
	treeOut, err := git("", "write-tree")
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	tree := strings.TrimSpace(string(treeOut))
	if _, err := git(result, "add", "-A", "-f", "--", "."); err != nil {
		return nil, "", false, fmt.Errorf("task diff: stage result: %w", err)
	}
	names, err := git("", "diff-index", "--cached", "--no-renames", "--name-only", "-z", tree)
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	quote := "off"
	for _, p := range strings.Split(strings.TrimSuffix(string(names), "\x00"), "\x00") {
		if p == "" {
			continue
		}
		changed = append(changed, p)
		if !utf8.ValidString(p) {
			quote = "on" // git then quotes the name in C style, in ASCII
		}
		if !utf8File(filepath.Join(base, p)) || !utf8File(filepath.Join(result, p)) {
			rules += "/" + attrPattern(p) + " -diff\n"
		}
	}
	if len(changed) == 0 {
		return nil, "", false, nil
	}
	if err := os.WriteFile(attrs, []byte(rules), 0o644); err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	out, err := git("", "-c", "core.quotepath="+quote, "diff-index", "--cached", "--no-renames", "-p", "--binary", tree)
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: %w", err)
	}
	diff, truncated = cutDiff(string(out), maxDiff)
	sort.Strings(changed)
	return changed, diff, truncated, nil
}

// hostGitEnv is the environment git runs with on the host for task diffs:
// no GIT_* variable of the caller (a GIT_DIR or GIT_INDEX_FILE would point
// it elsewhere), no user or system configuration, C locale.
func hostGitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C")
}

// utf8File reports whether the file at p is missing, not a regular file, or
// holds valid UTF-8.
func utf8File(p string) bool {
	info, err := os.Lstat(p)
	if err != nil || !info.Mode().IsRegular() {
		return true
	}
	data, err := os.ReadFile(p)
	return err != nil || utf8.Valid(data)
}

// attrPattern escapes a path for a gitattributes line, which splits on white
// space and has no quoting in older git: white space becomes [[:space:]] and
// glob characters are escaped with a backslash.
func attrPattern(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case strings.IndexByte(" \t\n\v\f\r", c) >= 0:
			b.WriteString("[[:space:]]")
		case strings.IndexByte(`*?[]\!#"`, c) >= 0:
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// cutDiff returns d, or when it is longer than max its longest prefix of
// whole file sections that fits, and whether it cut.
func cutDiff(d string, max int) (string, bool) {
	if len(d) <= max {
		return d, false
	}
	cut := strings.LastIndex(d[:max+1], "\ndiff --git ")
	if cut < 0 {
		return "", true
	}
	return d[:cut+1], true
}

// tarDir writes dir's contents as a tar under prefix ("workspace/"), every
// entry owned by uid:gid, symlinks as links.
func tarDir(w io.Writer, dir, prefix string, uid, gid int) error {
	tw := tar.NewWriter(w)
	if prefix != "" {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: prefix, Mode: 0o755, Uid: uid, Gid: gid, ModTime: time.Now()}); err != nil {
			return err
		}
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		if !info.Mode().IsRegular() && !info.IsDir() && info.Mode()&fs.ModeSymlink == 0 {
			return nil // sockets, devices, fifos
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = prefix + filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = uid, gid, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// extractTree unpacks a tar into dir for comparison: directories, regular
// files (mode bits kept), symbolic links and hard links. Entry names are
// taken relative to the archive root after dropping a leading "./" and
// strip ("workspace/"). Every write goes through an os.Root on dir, so
// neither a name with ".." nor a symbolic link can make it write outside
// dir. Entries inside a .git directory, at any depth, are skipped, as are
// devices, FIFOs and sockets.
func extractTree(r io.Reader, dir, strip string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	clean := func(name string) (string, bool, error) {
		name = strings.TrimPrefix(strings.TrimPrefix(name, "./"), strip)
		name = strings.TrimSuffix(path.Clean("/"+name), "/")
		name = strings.TrimPrefix(name, "/")
		if name == "" {
			return "", false, nil
		}
		if !fs.ValidPath(name) {
			return "", false, fmt.Errorf("tar entry %q: not a path inside the directory", name)
		}
		for _, part := range strings.Split(name, "/") {
			if part == ".git" {
				return "", false, nil
			}
		}
		return name, true, nil
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name, ok, err := clean(hdr.Name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		parent := path.Dir(name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return err
			}
			_ = root.Remove(name)
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := root.Chmod(name, os.FileMode(hdr.Mode)&0o777|0o600); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return err
			}
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
		case tar.TypeLink:
			target, ok, err := clean(hdr.Linkname)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return err
			}
			_ = root.Remove(name)
			if err := root.Link(target, name); err != nil {
				return err
			}
		}
	}
}
