package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/agents-sandbox/agents-sandbox/sandbox/provision"
)

// ProvisionedFile is one file provisioning wrote or found unchanged; never
// its contents.
type ProvisionedFile struct {
	Path   string `json:"path"` // relative to /home/dev
	Size   int64  `json:"size"` // bytes
	Sha256 string `json:"sha256"`
}

// HookResult is a startup hook's run.
type HookResult struct {
	Path     string `json:"path"`
	Root     bool   `json:"root"`
	ExitCode int    `json:"exit_code"`
	Output   string `json:"output"`
}

// ProvisionResult reports what provisioning did.
type ProvisionResult struct {
	Written   []ProvisionedFile `json:"written"`
	Removed   []string          `json:"removed"`
	Unchanged []ProvisionedFile `json:"unchanged"`
	Warnings  []string          `json:"warnings,omitempty"`
	Hooks     []HookResult      `json:"hooks,omitempty"`
	// Config is the merged agent config path, when snippets exist.
	Config string `json:"config,omitempty"`
	// DaemonRestarted is true when a changed config restarted the daemon.
	DaemonRestarted bool `json:"daemon_restarted,omitempty"`
}

// Provision syncs the agent's merged config and the [home] mappings into the
// project's running VM. It is idempotent: unchanged files are not rewritten,
// files it wrote earlier that lost their source are removed, and files the
// agent created itself are never touched. Startup hooks do not run here
// (only when a VM was just created or started).
func (m *Manager) Provision(ctx context.Context, p *Project) (ProvisionResult, error) {
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return ProvisionResult{}, err
	}
	lock, err := m.lockVM(ctx, p)
	if err != nil {
		return ProvisionResult{}, err
	}
	defer lock.Unlock()
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return ProvisionResult{}, err
	}
	return m.provisionLocked(ctx, p, st, vm, user, false, nil)
}

// provisionPlan builds the host-side plan for a project.
func (m *Manager) provisionPlan(p *Project) (provision.Plan, error) {
	home := map[string]provision.HomeMapping{}
	for t, h := range p.Config.Home {
		home[t] = provision.HomeMapping{Source: h.Source, Optional: h.Optional, Hook: h.Hook, Root: h.Root}
	}
	hostHome := ""
	for _, kv := range m.Environ {
		if strings.HasPrefix(kv, "HOME=") {
			hostHome = kv[5:]
		}
	}
	if hostHome == "" {
		hostHome, _ = os.UserHomeDir()
	}
	plan, err := provision.Build(provision.Input{
		Layers:   provision.StandardLayers(m.Dirs.Config, p.ID.RepoSlug, p.ID.ProjectDir, p.Agent.Name),
		Config:   p.Agent.Config,
		Snippets: p.Agent.Snippets,
		Home:     home,
		HostHome: hostHome,
	})
	if err != nil {
		return provision.Plan{}, fmt.Errorf("provision: %w: %w", ErrInvalid, err)
	}
	return plan, nil
}

// provisionLocked provisions vm; the caller holds the VM lock. started says
// the VM was just created or started, so startup hooks run.
func (m *Manager) provisionLocked(ctx context.Context, p *Project, st *State, vm, user string, started bool, progress ProgressFunc) (ProvisionResult, error) {
	res := ProvisionResult{Written: []ProvisionedFile{}, Removed: []string{}, Unchanged: []ProvisionedFile{}}
	plan, err := m.provisionPlan(p)
	if err != nil {
		return res, err
	}
	for _, w := range plan.Warnings {
		res.Warnings = append(res.Warnings, w.String())
		m.Log.Warn().Str("vm", vm).Msg("provision: " + w.String())
	}
	res.Config = plan.Config
	as := st.Agent(p.Names.Agent)
	write, remove, unchanged := provision.Diff(as.Provisioned, plan)

	// Provisioned files belong to dev, also when commands run as root
	// (RunAsRoot): root reads them anyway, and dev keeps its home.
	owner := user
	if owner == "0:0" && m.RunAsRoot {
		owner = "dev"
	}
	uid, gid, err := m.userIDs(ctx, vm, owner)
	if err != nil && owner != user {
		uid, gid, err = m.userIDs(ctx, vm, user) // an image without dev
	}
	if err != nil {
		return res, err
	}

	// Remove shadowed configs and stale files first, reporting only what
	// was there. It runs as root, but the home is the agent's: a path whose
	// directory resolves (through a link the agent made) outside /home/dev
	// is left alone.
	toRemove := append(append([]string{}, plan.Remove...), remove...)
	sort.Strings(toRemove)
	if len(toRemove) > 0 {
		const script = `for p; do
  case "$(readlink -f -- "$(dirname -- "$p")")" in ` + HomeDir + ` | ` + HomeDir + `/*) ;; *) continue ;; esac
  if [ -e "$p" ] || [ -L "$p" ]; then rm -rf -- "$p" && printf '%s\n' "$p" || exit 1; fi
done`
		args := []string{"sh", "-c", script, "sh"}
		for _, r := range toRemove {
			args = append(args, HomeDir+"/"+r)
		}
		var stdout, stderr bytes.Buffer
		r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: args, User: "0:0", Stdout: &stdout, Stderr: &stderr})
		if err != nil {
			return res, fmt.Errorf("provision: remove stale files: %w", err)
		}
		if r.ExitCode != 0 {
			return res, fmt.Errorf("provision: remove stale files: exit %d: %s", r.ExitCode, strings.TrimSpace(stderr.String()))
		}
		for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			if rel, ok := strings.CutPrefix(l, HomeDir+"/"); ok {
				res.Removed = append(res.Removed, rel)
			}
		}
	}

	configChanged := false
	if len(write) > 0 {
		only := plan.Only(write)
		warns, err := m.unlinkDirs(ctx, vm, only)
		if err != nil {
			return res, err
		}
		for _, w := range warns {
			res.Warnings = append(res.Warnings, w)
			m.Log.Warn().Str("vm", vm).Msg("provision: " + w)
		}
		var buf bytes.Buffer
		if err := only.Tar(&buf, uid, gid); err != nil {
			return res, fmt.Errorf("provision: %w", err)
		}
		if err := m.RT.CopyTo(ctx, vm, HomeDir, &buf); err != nil {
			return res, fmt.Errorf("provision: copy files into %s: %w (a path provisioning writes may have another type in the VM: a directory where a file goes, or a file where a directory goes; remove it there)", vm, err)
		}
		for _, w := range write {
			if f, ok := plan.Lookup(w); ok {
				res.Written = append(res.Written, ProvisionedFile{Path: f.Path, Size: f.Size, Sha256: f.Sha256})
				if f.Path == plan.Config {
					configChanged = true
				}
			}
		}
	}
	for _, u := range unchanged {
		if f, ok := plan.Lookup(u); ok {
			res.Unchanged = append(res.Unchanged, ProvisionedFile{Path: f.Path, Size: f.Size, Sha256: f.Sha256})
		}
	}
	as.Provisioned = plan.Hashes()
	if err := SaveState(p.Names.StateDir, st); err != nil {
		return res, err
	}

	if started {
		for _, h := range plan.Hooks {
			hr := HookResult{Path: h.Path, Root: h.Root}
			u := user
			if h.Root {
				u = "0:0"
			}
			var out bytes.Buffer
			w := &lineWriter{fn: progress}
			r, err := m.execIn(ctx, vm, u, Workspace, ExecOptions{Cmd: []string{h.Path}, Stdout: w, Stderr: w, OutputCap: 64 << 10})
			w.Flush()
			hr.ExitCode = r.ExitCode
			out.WriteString(r.Stdout.Text)
			out.WriteString(r.Stderr.Text)
			hr.Output = out.String()
			res.Hooks = append(res.Hooks, hr)
			if err != nil {
				return res, fmt.Errorf("startup hook %s: %w", h.Path, err)
			}
			if r.ExitCode != 0 {
				return res, fmt.Errorf("startup hook %s failed with exit code %d; its output:\n%s", h.Path, r.ExitCode, strings.TrimSpace(hr.Output))
			}
		}
	}
	if configChanged && !started && len(p.Agent.Serve) > 0 && m.daemonHealthy(ctx, p, vm, user) {
		if err := m.ensureDaemon(ctx, p, vm, user, true); err != nil {
			return res, err
		}
		res.DaemonRestarted = true
	}
	return res, nil
}

// unlinkDirs removes symbolic links the agent put where plan has (or
// implies) a directory, so that copying the plan in makes the directory
// again: the engine refuses to extract a directory over a link. A link whose
// own directory resolves outside /home/dev is left alone. It returns a
// warning for each link removed.
func (m *Manager) unlinkDirs(ctx context.Context, vm string, plan provision.Plan) ([]string, error) {
	dirs := map[string]bool{}
	for _, f := range plan.Files {
		if f.Dir {
			dirs[f.Path] = true
		}
		for d := path.Dir(f.Path); d != "." && d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	if len(dirs) == 0 {
		return nil, nil
	}
	list := make([]string, 0, len(dirs))
	for d := range dirs {
		list = append(list, HomeDir+"/"+d)
	}
	sort.Strings(list) // parents first
	const script = `for p; do
  case "$(readlink -f -- "$(dirname -- "$p")")" in ` + HomeDir + ` | ` + HomeDir + `/*) ;; *) continue ;; esac
  if [ -L "$p" ]; then t=$(readlink -- "$p"); rm -f -- "$p" && printf '%s\t%s\n' "$p" "$t" || exit 1; fi
done`
	var stdout, stderr bytes.Buffer
	r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: append([]string{"sh", "-c", script, "sh"}, list...), User: "0:0", Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return nil, fmt.Errorf("provision: check directories: %w", err)
	}
	if r.ExitCode != 0 {
		return nil, fmt.Errorf("provision: check directories: exit %d: %s", r.ExitCode, strings.TrimSpace(stderr.String()))
	}
	var warns []string
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		p, target, ok := strings.Cut(l, "\t")
		if !ok {
			continue
		}
		warns = append(warns, fmt.Sprintf("%s was a link to %s in the VM; replaced with the provisioned directory", strings.TrimPrefix(p, HomeDir+"/"), target))
	}
	return warns, nil
}

// userIDs returns the uid and gid of user inside vm.
func (m *Manager) userIDs(ctx context.Context, vm, user string) (int, int, error) {
	var out, stderr bytes.Buffer
	r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{"sh", "-c", "id -u; id -g"}, User: user, Stdout: &out, Stderr: &stderr})
	if err != nil {
		return 0, 0, fmt.Errorf("look up user %q in %s: %w", user, vm, err)
	}
	f := strings.Fields(out.String())
	if r.ExitCode != 0 || len(f) != 2 {
		return 0, 0, fmt.Errorf("look up user %q in %s: exit %d: %s", user, vm, r.ExitCode, strings.TrimSpace(stderr.String()))
	}
	uid, err1 := strconv.Atoi(f[0])
	gid, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("look up user %q in %s: unexpected output %q", user, vm, out.String())
	}
	return uid, gid, nil
}

// lineWriter sends whole lines to a ProgressFunc; Flush sends a last line
// that has no newline. It is safe for concurrent writers (stdout and
// stderr of one command).
type lineWriter struct {
	mu  sync.Mutex
	fn  ProgressFunc
	buf []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	if w.fn == nil {
		return len(p), nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.fn(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Flush sends what is left after the last newline.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fn != nil && len(w.buf) > 0 {
		w.fn(string(w.buf))
	}
	w.buf = nil
}
