package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// ExecInput is the input of sandbox_exec.
type ExecInput struct {
	Target
	// Cmd is the command and its arguments (no shell: use ["bash","-lc","..."]).
	Cmd []string `json:"cmd"`
	// User runs the command as this user ("root", "1000"); default the VM's user.
	User string `json:"user,omitempty"`
	// WorkDir is the working directory in the VM; default the caller's place
	// under /workspace.
	WorkDir string `json:"workdir,omitempty"`
	// Env are extra NAME=VALUE variables.
	Env []string `json:"env,omitempty"`
	// Stdin is sent to the command's standard input.
	Stdin string `json:"stdin,omitempty"`
	// TimeoutSeconds kills the command's process group after this long; 0 none.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// OutputCapBytes bounds the bytes kept of each of stdout and stderr.
	OutputCapBytes int `json:"output_cap_bytes,omitempty"`
	// Worktree ("NAME[:BASE]") runs the command in that worktree session
	// inside the VM (made when missing) instead of under /workspace.
	Worktree string `json:"worktree,omitempty"`
}

// StreamOutput is one captured output stream.
type StreamOutput struct {
	Text      string `json:"text"`
	Encoding  string `json:"encoding"`
	Bytes     int64  `json:"bytes"`
	Kept      int64  `json:"kept"`
	Truncated bool   `json:"truncated"`
}

// ExecOutput is how a command ended (sandbox_exec, sandbox_attach).
type ExecOutput struct {
	ExitCode   int          `json:"exit_code"`
	Stdout     StreamOutput `json:"stdout"`
	Stderr     StreamOutput `json:"stderr"`
	TimedOut   bool         `json:"timed_out"`
	Cancelled  bool         `json:"cancelled"`
	DurationMS int64        `json:"duration_ms"`
}

func streamOutput(o sandbox.Output) StreamOutput {
	enc := o.Encoding
	if enc == "" {
		enc = "utf-8"
	}
	return StreamOutput{Text: o.Text, Encoding: enc, Bytes: o.Bytes, Kept: o.Kept, Truncated: o.Truncated}
}

func execOutput(r sandbox.CommandResult) ExecOutput {
	return ExecOutput{ExitCode: r.ExitCode, Stdout: streamOutput(r.Stdout), Stderr: streamOutput(r.Stderr), TimedOut: r.TimedOut, Cancelled: r.Cancelled, DurationMS: r.DurationMS}
}

func execSummary(what string, r ExecOutput) string {
	var b strings.Builder
	switch {
	case r.TimedOut:
		fmt.Fprintf(&b, "%s timed out after %d ms and was killed (exit %d)", what, r.DurationMS, r.ExitCode)
	case r.Cancelled:
		fmt.Fprintf(&b, "%s was cancelled after %d ms (exit %d)", what, r.DurationMS, r.ExitCode)
	default:
		fmt.Fprintf(&b, "%s exited %d after %d ms", what, r.ExitCode, r.DurationMS)
	}
	fmt.Fprintf(&b, "; stdout %d bytes, stderr %d bytes", r.Stdout.Bytes, r.Stderr.Bytes)
	if r.Stdout.Truncated || r.Stderr.Truncated {
		b.WriteString(" (truncated: raise output_cap_bytes to keep more)")
	}
	return b.String()
}

func (h *handlers) execTool() Tool {
	return define(Tool{
		Name:  "sandbox_exec",
		Title: "Run a command in the project's sandbox",
		Description: "Run one command in the project's sandbox VM (created with sandbox_create; a stopped VM is started) " +
			"and return its exit code, stdout and stderr (each capped; truncation is flagged). The checkout is at /workspace. " +
			"cmd is an argument vector, not a shell line: use [\"bash\",\"-lc\",\"...\"] for pipes and globs. " +
			"Output lines stream as progress notifications. A timeout or a cancellation kills the command's whole process group. " +
			"With worktree (\"NAME[:BASE]\") it runs in a git worktree session inside the VM instead, leaving the host checkout untouched.",
		InputSchema: "sandbox_exec.input.json", OutputSchema: "sandbox_exec.output.json",
		Hints: Hints{ReadOnly: No, Destructive: Yes, Idempotent: No, OpenWorld: Yes},
	}, func(ctx context.Context, c Call, in *ExecInput) (ExecOutput, string, error) {
		const tool = "sandbox_exec"
		if len(in.Cmd) == 0 {
			return ExecOutput{}, "", InvalidParams(tool, "/cmd", "cmd must name a command, e.g. [\"ls\", \"-la\"]")
		}
		env, err := parseEnv(tool, "/env", in.Env)
		if err != nil {
			return ExecOutput{}, "", err
		}
		if err := checkWorktree(tool, in.Worktree); err != nil {
			return ExecOutput{}, "", err
		}
		p, err := h.open(ctx, tool, in.Target)
		if err != nil {
			return ExecOutput{}, "", err
		}
		rep := newReporter(c)
		stdout, stderr := rep.writer("stdout: "), rep.writer("stderr: ")
		opts := sandbox.ExecOptions{Cmd: in.Cmd, User: in.User, WorkDir: in.WorkDir, Env: env,
			Timeout: seconds(in.TimeoutSeconds), OutputCap: in.OutputCapBytes, Stdout: stdout, Stderr: stderr, Worktree: in.Worktree}
		if in.Stdin != "" {
			opts.Stdin = strings.NewReader(in.Stdin)
		}
		r, err := h.Core.Exec(ctx, p, opts)
		stdout.flush()
		stderr.flush()
		if err != nil {
			return ExecOutput{}, "", worktreeError(tool, err)
		}
		out := execOutput(r)
		return out, execSummary(fmt.Sprintf("%q", strings.Join(in.Cmd, " ")), out), nil
	})
}

// AttachInput is the input of sandbox_attach.
type AttachInput struct {
	Target
	// Args are appended to the agent's command.
	Args []string `json:"args,omitempty"`
	// Headless runs the agent's headless command (one prompt in, output out)
	// instead of its attach command.
	Headless       bool     `json:"headless,omitempty"`
	Env            []string `json:"env,omitempty"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty"`
	OutputCapBytes int      `json:"output_cap_bytes,omitempty"`
	// Worktree ("NAME[:BASE]") runs the agent in that worktree session
	// inside the VM (made when missing) instead of under /workspace.
	Worktree string `json:"worktree,omitempty"`
}

func (h *handlers) attachTool() Tool {
	return define(Tool{
		Name:  "sandbox_attach",
		Title: "Run the agent in the project's sandbox",
		Description: "Run the project's agent in its sandbox VM without a terminal: the agent's attach command (or, with headless, " +
			"its headless one-prompt command) with args appended, started after the agent's daemon is up. Returns exit code, stdout " +
			"and stderr like sandbox_exec. The VM must exist (sandbox_create). With worktree (\"NAME[:BASE]\") the agent works in a git " +
			"worktree session inside the VM (branch agents-sandbox/NAME) and the host checkout is left untouched.",
		InputSchema: "sandbox_attach.input.json", OutputSchema: "sandbox_attach.output.json",
		Hints: Hints{ReadOnly: No, Destructive: Yes, Idempotent: No, OpenWorld: Yes},
	}, func(ctx context.Context, c Call, in *AttachInput) (ExecOutput, string, error) {
		const tool = "sandbox_attach"
		env, err := parseEnv(tool, "/env", in.Env)
		if err != nil {
			return ExecOutput{}, "", err
		}
		if err := checkWorktree(tool, in.Worktree); err != nil {
			return ExecOutput{}, "", err
		}
		p, err := h.open(ctx, tool, in.Target)
		if err != nil {
			return ExecOutput{}, "", err
		}
		rep := newReporter(c)
		stdout, stderr := rep.writer("stdout: "), rep.writer("stderr: ")
		r, err := h.Core.Attach(ctx, p, sandbox.AttachOptions{Args: in.Args, Headless: in.Headless, Env: env,
			Timeout: seconds(in.TimeoutSeconds), OutputCap: in.OutputCapBytes, Stdout: stdout, Stderr: stderr, Worktree: in.Worktree})
		stdout.flush()
		stderr.flush()
		if err != nil {
			return ExecOutput{}, "", worktreeError(tool, err)
		}
		out := execOutput(r)
		return out, execSummary("agent "+p.Names.Agent, out), nil
	})
}
