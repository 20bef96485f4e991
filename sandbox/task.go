package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
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
)

// TaskOptions is one task sandbox run.
type TaskOptions struct {
	// Cmd is the command to run. When empty, the agent's headless command
	// runs with AgentArgs appended.
	Cmd       []string
	AgentArgs []string
	Env       map[string]string
	Timeout   time.Duration // 0: no timeout
	Workspace WorkspaceMode // default copy
	Home      HomeMode      // default fresh
	Keep      bool          // keep the sandbox afterwards (stopped)
	OutputCap int
	Resources *Resources // nil: the project's
	Stdout    io.Writer  // optional live copy of stdout
	Stderr    io.Writer
	Progress  ProgressFunc
}

// TaskResult is how a task ended. Diff and Changed are set for copy
// workspaces: Changed lists paths relative to the checkout root, Diff is a
// unified diff (git format, a/ and b/ prefixes) that `git apply` takes in the
// checkout.
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
}

// maxDiff bounds the diff returned in a TaskResult (8 MiB).
const maxDiff = 8 << 20

// SpawnTask runs one command in a new, short-lived sandbox made from the
// checkout's runner image, then removes it (unless Keep). It never touches
// the project VM or its home volume (unless Home is readonly). It is safe to
// call concurrently: every task gets its own name.
func (m *Manager) SpawnTask(ctx context.Context, p *Project, o TaskOptions) (TaskResult, error) {
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
	img, err := m.ensureImage(ctx, p, CreateOptions{Progress: o.Progress})
	if err != nil {
		return res, err
	}

	// The same egress as the project VM: same proxy, placeholders, policy.
	var eg egress
	{
		lock, err := m.lockVM(ctx, p)
		if err != nil {
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
			if o.Home == HomeReadOnly {
				st, err := LoadState(p.Names.StateDir)
				if err != nil {
					return res, err
				}
				as := st.Agents[p.Names.Agent]
				if as == nil || as.HomeVolume == "" {
					return res, fmt.Errorf("home readonly: %w: the project VM has no home volume yet; create it first", ErrNotFound)
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

	// Create under a unique name; retry on the rare nanosecond collision.
	var name string
	for i := 0; ; i++ {
		name = p.Names.TaskName(m.now())
		spec.Name = name
		_, err = m.RT.CreateVM(ctx, spec)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrConflict) || i > 5 {
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
	er, err := m.execIn(ctx, name, img.User, workdirFor(p), ExecOptions{Cmd: cmd, Env: o.Env, Timeout: o.Timeout, OutputCap: o.OutputCap, Stdout: o.Stdout, Stderr: o.Stderr})
	res.ExitCode, res.Stdout, res.Stderr, res.TimedOut, res.DurationMS = er.ExitCode, er.Stdout, er.Stderr, er.TimedOut, er.DurationMS
	if err != nil {
		return res, err
	}
	if snapshot != nil && ctx.Err() == nil {
		changed, diff, trunc, err := m.taskDiff(ctx, name, snapshot.Name())
		if err != nil {
			return res, err
		}
		res.Changed, res.Diff, res.DiffTruncated = changed, diff, trunc
	}
	return res, ctx.Err()
}

// taskDiff compares the task's /workspace with the snapshot it started from.
func (m *Manager) taskDiff(ctx context.Context, name, snapshot string) ([]string, string, bool, error) {
	tmp, err := os.MkdirTemp("", "agents-sandbox-diff-*")
	if err != nil {
		return nil, "", false, err
	}
	defer os.RemoveAll(tmp)
	base, result := filepath.Join(tmp, "a"), filepath.Join(tmp, "b")
	f, err := os.Open(snapshot)
	if err != nil {
		return nil, "", false, err
	}
	err = untarDir(f, base, "workspace/")
	f.Close()
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: unpack snapshot: %w", err)
	}
	rc, err := m.RT.CopyFrom(ctx, name, Workspace+"/.")
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: copy /workspace out of %q: %w", name, err)
	}
	err = untarDir(rc, result, "")
	rc.Close()
	if err != nil {
		return nil, "", false, fmt.Errorf("task diff: unpack result: %w", err)
	}
	// git diff --no-index compares the two trees; paths come out as
	// a/<file> and b/<file> because it runs from tmp with a and b as args.
	cmd := exec.CommandContext(ctx, "git", "-c", "core.quotepath=off", "diff", "--no-index", "--no-renames", "--binary", "--no-color", "--no-ext-diff", "--src-prefix=", "--dst-prefix=", "a", "b")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return nil, "", false, fmt.Errorf("task diff: git diff: %w: %s", err, stderr.String())
		}
	}
	diff, changed := rewriteNoIndexDiff(out.String())
	trunc := false
	if len(diff) > maxDiff {
		diff, trunc = diff[:maxDiff], true
	}
	return changed, diff, trunc, nil
}

// rewriteNoIndexDiff turns `git diff --no-index a b` output (with empty
// prefixes, so paths read a/x and b/x) into a diff with a/ and b/ prefixes
// relative to the checkout root, and lists the changed paths. Changes under
// .git are dropped.
func rewriteNoIndexDiff(d string) (string, []string) {
	var out strings.Builder
	var changed []string
	skip := false
	for _, line := range strings.SplitAfter(d, "\n") {
		if strings.HasPrefix(line, "diff --git ") {
			rest := strings.TrimSuffix(strings.TrimPrefix(line, "diff --git "), "\n")
			// "a/x b/x", "a/x b/x" with x possibly only on one side
			var path string
			if i := strings.Index(rest, " b/"); i >= 0 {
				path = strings.TrimPrefix(rest[i+1:], "b/")
				if strings.HasPrefix(rest, "a/") {
					path = strings.TrimPrefix(rest[:i], "a/")
				}
			}
			skip = path == ".git" || strings.HasPrefix(path, ".git/")
			if !skip {
				changed = append(changed, path)
				out.WriteString("diff --git a/" + path + " b/" + path + "\n")
			}
			continue
		}
		if skip {
			continue
		}
		out.WriteString(line)
	}
	sort.Strings(changed)
	return out.String(), changed
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

// untarDir extracts a tar into dir, refusing paths that escape it. strip is
// a leading path component to drop ("workspace/").
func untarDir(r io.Reader, dir, strip string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
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
		name := strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), strip)
		if name == "" || name == "." {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		if !within(target, dir) {
			return fmt.Errorf("tar entry %q escapes the target directory", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode)&0o777|0o200)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
			_ = os.Chmod(target, os.FileMode(hdr.Mode)&0o777)
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			_ = os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		}
	}
}
