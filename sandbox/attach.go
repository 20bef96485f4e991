package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// daemonLog is where an agent daemon's output goes inside the VM.
const daemonLog = HomeDir + "/.cache/agents-sandbox/daemon.log"

// ensureDaemon starts the agent's daemon unless its health check passes, and
// waits until it does (60 s). restart kills a running daemon first.
//
// Callers take turns (a lock per checkout and agent), so a second attach
// arriving while the first starts the daemon waits for it and then finds it
// healthy instead of starting another. A daemon that runs but fails its
// health check (hung, or broken by a config change) is killed before the new
// one starts: its session id must be free for the new one.
func (m *Manager) ensureDaemon(ctx context.Context, p *Project, vm, user string, restart bool) error {
	a := p.Agent
	if len(a.Serve) == 0 {
		return nil
	}
	lock, err := AcquireLock(ctx, LockFile(p.Names.StateDir, "daemon-"+p.Names.Agent))
	if err != nil {
		return fmt.Errorf("start %s daemon: %w", a.Name, err)
	}
	defer lock.Unlock()
	if !restart && m.daemonHealthy(ctx, p, vm, user) {
		return nil
	}
	if err := m.stopDaemon(ctx, p, vm); err != nil {
		return fmt.Errorf("start %s daemon: %w", a.Name, err)
	}
	// The daemon runs through vm-exec --daemon (it does not keep the VM from
	// idling) with its output appended to a log file in the home volume.
	script := `mkdir -p "$(dirname "$0")" && exec "$@" >>"$0" 2>&1`
	cmd := append([]string{InitPath, "vm-exec", "--daemon", "--id", daemonSession(p), "--", "sh", "-c", script, daemonLog}, a.Serve...)
	var stderr bytes.Buffer
	r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: cmd, User: user, WorkDir: Workspace, Detach: true, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("start %s daemon: %w", a.Name, err)
	}
	if r.ExitCode > 0 {
		return fmt.Errorf("start %s daemon: exit %d: %s", a.Name, r.ExitCode, strings.TrimSpace(stderr.String()))
	}
	deadline := time.Now().Add(60 * time.Second)
	// Poll quickly at first (a daemon is often up within a few hundred
	// milliseconds, and the restart of an idle VM waits on it), then every
	// 200 ms.
	delay := 20 * time.Millisecond
	for {
		if m.daemonHealthy(ctx, p, vm, user) {
			return nil
		}
		if time.Now().After(deadline) {
			tail := m.tailFile(ctx, vm, daemonLog, 20)
			return fmt.Errorf("the %s daemon (%s) did not pass its health check within 60 s; its log (%s) ends:\n%s", a.Name, strings.Join(a.Serve, " "), daemonLog, tail)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

func daemonSession(p *Project) string { return "daemon-" + p.Names.Agent }

// stopDaemon kills the daemon's session, if one is alive, and waits (10 s)
// until it has ended, so that its id can be used again.
func (m *Manager) stopDaemon(ctx context.Context, p *Project, vm string) error {
	id := daemonSession(p)
	if err := m.killSession(ctx, vm, id); err != nil {
		// No live session (the usual case), or one that cannot be
		// killed: starting the new daemon then fails and says so.
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.sessionAlive(ctx, vm, id) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the old daemon (session %s) did not end within 10 s of SIGKILL", id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// sessionAlive reports whether a vm-exec session is alive, by sending its
// process group the harmless SIGCONT (vm-kill fails for an ended session).
func (m *Manager) sessionAlive(ctx context.Context, vm, id string) bool {
	r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{InitPath, "vm-kill", "--signal", "CONT", id}, User: "0:0"})
	return err == nil && r.ExitCode == 0
}

func (m *Manager) daemonHealthy(ctx context.Context, p *Project, vm, user string) bool {
	check := p.Agent.Health
	if len(check) == 0 {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := m.RT.Exec(hctx, vm, ExecRequest{Cmd: check, User: user, WorkDir: Workspace})
	return err == nil && r.ExitCode == 0
}

func (m *Manager) tailFile(ctx context.Context, vm, path string, n int) string {
	var out bytes.Buffer
	_, _ = m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{"tail", "-n", fmt.Sprint(n), path}, User: "0:0", Stdout: &out, Stderr: &out})
	return out.String()
}

// AttachOptions run the agent's attach (interactive) or headless command.
type AttachOptions struct {
	// Args are forwarded after the agent's command (everything after `--`).
	Args []string
	// Headless runs the agent's headless command (one prompt in, output
	// out) instead of the interactive one.
	Headless bool
	// Interactive terminal streams; with TTY the output all goes to Stdout.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	TTY            bool
	Resize         <-chan TermSize
	Timeout        time.Duration
	OutputCap      int
	Env            map[string]string
	// Worktree, when set ("NAME[:BASE]"), runs the agent in that worktree
	// session inside the VM (made when missing, see OpenWorktree) instead
	// of under /workspace.
	Worktree string
}

// Attach makes sure the agent's daemon is up and runs the agent's attach (or
// headless) command in the VM as its user, in the directory under
// /workspace matching where the caller stands, with opts.Args appended.
// Several attaches may run at once.
func (m *Manager) Attach(ctx context.Context, p *Project, opts AttachOptions) (CommandResult, error) {
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return CommandResult{}, err
	}
	if err := m.ensureDaemon(ctx, p, vm, user, false); err != nil {
		return CommandResult{}, err
	}
	base := p.Agent.Attach
	if opts.Headless {
		base = p.Agent.Headless
	}
	if len(base) == 0 {
		return CommandResult{}, fmt.Errorf("agent %q: %w: it has no %s command; define one under [agents.%s]", p.Agent.Name, ErrInvalid, map[bool]string{true: "headless", false: "attach"}[opts.Headless], p.Agent.Name)
	}
	cmd := append(append([]string{}, base...), opts.Args...)
	if opts.Headless && isShellC(base) && len(opts.Args) > 1 {
		// `bash -lc ARGS`: the arguments form one script.
		cmd = append(append([]string{}, base...), strings.Join(opts.Args, " "))
	}
	dir, env := workdirFor(p), opts.Env
	if opts.Worktree != "" {
		if dir, env, err = m.worktreeExec(ctx, p, vm, user, opts.Worktree, "", opts.Env); err != nil {
			return CommandResult{}, err
		}
	}
	return m.execIn(ctx, vm, user, dir, ExecOptions{
		Cmd: cmd, Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr,
		TTY: opts.TTY, Resize: opts.Resize, Timeout: opts.Timeout, OutputCap: opts.OutputCap, Env: env,
	})
}

func isShellC(cmd []string) bool {
	last := cmd[len(cmd)-1]
	return strings.HasPrefix(last, "-") && strings.HasSuffix(last, "c")
}
