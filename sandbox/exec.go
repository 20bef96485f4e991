package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// DefaultOutputCap is how many bytes of each of stdout and stderr an exec
// keeps when the caller does not say (1 MiB).
const DefaultOutputCap = 1 << 20

// ExecOptions is a command to run in a project's VM.
type ExecOptions struct {
	Cmd     []string
	User    string // default: the VM's user (dev)
	WorkDir string // default: the caller's place under /workspace
	Env     map[string]string
	Stdin   io.Reader
	// Timeout kills the command's whole process group when it runs longer;
	// 0 means no timeout.
	Timeout time.Duration
	// OutputCap bounds the bytes kept of each stream (DefaultOutputCap when
	// 0); the command keeps running and its extra output is counted, not kept.
	OutputCap int
	// Stdout and Stderr, when set, also receive the full streams as they
	// come (for streaming to a terminal or as progress).
	Stdout, Stderr io.Writer
	TTY            bool
	Resize         <-chan TermSize
	// Daemon marks the command as a background service: it does not keep
	// the VM from going idle.
	Daemon bool
	// Worktree, when set ("NAME[:BASE]"), runs the command in that worktree
	// session inside the VM, made when missing (see OpenWorktree); WorkDir
	// then defaults to the session's worktree. Project VMs only.
	Worktree string
}

// Output is one captured stream.
type Output struct {
	// Text is the kept output: UTF-8 text when Encoding is "utf-8", base64
	// of the raw bytes when Encoding is "base64" (the output was not valid
	// UTF-8).
	Text      string `json:"text"`
	Encoding  string `json:"encoding"`
	Bytes     int64  `json:"bytes"`     // total bytes the command wrote
	Kept      int64  `json:"kept"`      // bytes kept in Text (before encoding)
	Truncated bool   `json:"truncated"` // Bytes > Kept
}

// CommandResult is how a command in the VM ended.
type CommandResult struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     Output `json:"stdout"`
	Stderr     Output `json:"stderr"`
	TimedOut   bool   `json:"timed_out"`
	Cancelled  bool   `json:"cancelled"`
	DurationMS int64  `json:"duration_ms"`
}

// capWriter keeps the first cap bytes and counts the rest.
type capWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	cap   int
	total int64
	tee   io.Writer
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.total += int64(len(p))
	if room := w.cap - w.buf.Len(); room > 0 {
		if room > len(p) {
			room = len(p)
		}
		w.buf.Write(p[:room])
	}
	tee := w.tee
	w.mu.Unlock()
	if tee != nil {
		_, _ = tee.Write(p)
	}
	return len(p), nil
}

func (w *capWriter) output() Output {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.buf.Bytes()
	o := Output{Bytes: w.total, Kept: int64(len(b)), Truncated: w.total > int64(len(b))}
	// A cut in the middle of a multi-byte rune is not an encoding problem.
	check := b
	if o.Truncated {
		for i := 0; i < utf8.UTFMax && len(check) > 0 && !utf8.Valid(check); i++ {
			check = check[:len(check)-1]
		}
	}
	if utf8.Valid(check) {
		o.Text, o.Encoding = string(check), "utf-8"
		o.Kept = int64(len(check))
	} else {
		o.Text, o.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	return o
}

func newSessionID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// execIn runs a command in vm through the in-VM exec wrapper, so it runs in
// its own process group that a timeout or cancellation kills as a whole.
func (m *Manager) execIn(ctx context.Context, vm, defUser, defDir string, o ExecOptions) (CommandResult, error) {
	if len(o.Cmd) == 0 {
		return CommandResult{}, fmt.Errorf("exec: %w: no command given", ErrInvalid)
	}
	capN := o.OutputCap
	if capN <= 0 {
		capN = DefaultOutputCap
	}
	user := o.User
	if user == "" {
		user = defUser
	}
	dir := o.WorkDir
	if dir == "" {
		dir = defDir
	}
	id := newSessionID()
	cmd := []string{InitPath, "vm-exec", "--id", id}
	if o.Daemon {
		cmd = append(cmd, "--daemon")
	}
	if o.TTY && o.Resize != nil {
		// The first size reaches the terminal just after the exec starts.
		cmd = append(cmd, "--wait-tty-size", "1s")
	}
	if o.Timeout > 0 {
		// A backstop inside the VM in case this process dies: a little
		// later than the host-side kill below.
		cmd = append(cmd, "--timeout", (o.Timeout + 5*time.Second).String())
	}
	cmd = append(cmd, "--")
	cmd = append(cmd, o.Cmd...)
	env := sortedKV(o.Env)

	stdout := &capWriter{cap: capN, tee: o.Stdout}
	stderr := &capWriter{cap: capN, tee: o.Stderr}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Set by the timer goroutine before it cancels runCtx.
	var timerFired atomic.Bool
	if o.Timeout > 0 {
		timer := time.AfterFunc(o.Timeout, func() {
			timerFired.Store(true)
			cancel()
		})
		defer timer.Stop()
	}
	start := time.Now()
	type done struct {
		r   CommandResult
		err error
	}
	ch := make(chan done, 1)
	go func() {
		r, err := m.RT.Exec(runCtx, vm, ExecRequest{Cmd: cmd, User: user, WorkDir: dir, Env: env, Stdin: o.Stdin, Stdout: stdout, Stderr: stderr, TTY: o.TTY, Resize: o.Resize})
		ch <- done{CommandResult{ExitCode: r.ExitCode}, err}
	}()
	var d done
	got := false
	select {
	case d = <-ch:
		got = true
	case <-runCtx.Done():
	}
	// killed: the command was still running when the timeout or the
	// caller's cancellation came (or Exec gave up because of it), and was
	// killed. A command that ended on its own just as either came keeps its
	// own exit code and is neither timed out nor cancelled.
	var killed, timedOut bool
	if runCtx.Err() != nil && (!got || d.err != nil) {
		killed = true
		timedOut = timerFired.Load()
		// Kill the whole process group inside the VM, then collect what
		// the exec call returns.
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		kerr := m.killSession(kctx, vm, id)
		kcancel()
		if kerr != nil {
			m.Log.Warn().Err(kerr).Str("vm", vm).Str("session", id).Msg("could not kill the timed-out command")
		}
		if !got {
			d = <-ch
		}
		d.err = nil
		if timedOut {
			d.r.ExitCode = 124
		} else {
			d.r.ExitCode = 130
		}
	}
	res := d.r
	res.DurationMS = time.Since(start).Milliseconds()
	res.Stdout, res.Stderr = stdout.output(), stderr.output()
	res.TimedOut = killed && timedOut
	res.Cancelled = killed && !timedOut
	if d.err != nil {
		return res, fmt.Errorf("exec in VM %q: %w", vm, d.err)
	}
	return res, nil
}

// killSession kills a vm-exec session's process group.
func (m *Manager) killSession(ctx context.Context, vm, id string) error {
	var stderr bytes.Buffer
	r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{InitPath, "vm-kill", id}, User: "0:0", Stderr: &stderr})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("vm-kill %s: exit %d: %s", id, r.ExitCode, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Exec runs a command in the project's VM, which must exist (Create makes
// it); a stopped VM is started first. Errors: ErrNotFound when the VM does
// not exist, ErrInvalid for an empty command.
func (m *Manager) Exec(ctx context.Context, p *Project, o ExecOptions) (CommandResult, error) {
	vm, user, err := m.runningVM(ctx, p)
	if err != nil {
		return CommandResult{}, err
	}
	if o.Worktree != "" {
		if o.WorkDir, o.Env, err = m.worktreeExec(ctx, p, vm, user, o.Worktree, o.WorkDir, o.Env); err != nil {
			return CommandResult{}, err
		}
	}
	return m.execIn(ctx, vm, user, workdirFor(p), o)
}

// runningVM returns the project's VM name and user, starting it when stopped.
func (m *Manager) runningVM(ctx context.Context, p *Project) (string, string, error) {
	name, vm, err := m.findVM(ctx, p)
	if err != nil {
		if isNotFound(err) {
			hint := ""
			if others, lerr := m.RT.ListVMs(ctx, map[string]string{LabelKind: string(KindVM), LabelCheckout: p.ID.CheckoutSlug}); lerr == nil && len(others) > 0 {
				var agents []string
				for _, o := range others {
					agents = append(agents, o.Labels[LabelAgent])
				}
				sort.Strings(agents)
				hint = fmt.Sprintf("; this checkout has a VM for agent %s: pass --agent %s (tools: \"agent\"), or set agent = %q in the config", strings.Join(agents, ", "), agents[0], agents[0])
			}
			return "", "", fmt.Errorf("VM %q: %w: create it first (agents-sandbox create, or the sandbox_create tool)%s", p.Names.VM, ErrNotFound, hint)
		}
		return "", "", err
	}
	if vm.State != VMRunning {
		if err := m.RT.StartVM(ctx, name); err != nil {
			return "", "", fmt.Errorf("start VM %q: %w", name, err)
		}
		if err := m.waitReady(ctx, name); err != nil {
			return "", "", err
		}
	}
	user := vm.Labels[labelUser]
	if user == "" {
		user = "dev"
	}
	return name, user, nil
}

// labelUser records on the VM the user commands run as.
const labelUser = "org.agents-sandbox.user"
