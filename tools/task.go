package tools

import (
	"context"
	"fmt"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// TaskResources are a task sandbox's limits; omitted fields take the
// project's.
type TaskResources struct {
	CPUs   float64 `json:"cpus,omitempty"`
	Memory string  `json:"memory,omitempty"`
	Pids   int64   `json:"pids,omitempty"`
}

// SpawnTaskInput is the input of sandbox_spawn_task.
type SpawnTaskInput struct {
	Target
	// Cmd is the command to run; when empty the agent's headless command
	// runs with AgentArgs appended.
	Cmd            []string       `json:"cmd,omitempty"`
	AgentArgs      []string       `json:"agent_args,omitempty"`
	Env            []string       `json:"env,omitempty"`
	TimeoutSeconds int            `json:"timeout_seconds,omitempty"`
	Workspace      string         `json:"workspace,omitempty"` // copy (default), mount, none
	Home           string         `json:"home,omitempty"`      // fresh (default), readonly
	Keep           bool           `json:"keep,omitempty"`
	OutputCapBytes int            `json:"output_cap_bytes,omitempty"`
	Resources      *TaskResources `json:"resources,omitempty"`
	// Worktree ("NAME[:BASE]") runs the task in that worktree session
	// (made when missing), on the project VM's home volume.
	Worktree string `json:"worktree,omitempty"`
}

// SpawnTaskOutput is how a task ended.
type SpawnTaskOutput struct {
	Name          string       `json:"name"`
	Kept          bool         `json:"kept"`
	ExitCode      int          `json:"exit_code"`
	Stdout        StreamOutput `json:"stdout"`
	Stderr        StreamOutput `json:"stderr"`
	TimedOut      bool         `json:"timed_out"`
	DurationMS    int64        `json:"duration_ms"`
	Workspace     string       `json:"workspace"`
	Changed       []string     `json:"changed"`
	Diff          string       `json:"diff"`
	DiffTruncated bool         `json:"diff_truncated"`
	// Worktree is the worktree session after the task (worktree tasks).
	Worktree *WorktreeInfo `json:"worktree,omitempty"`
}

func (h *handlers) spawnTaskTool() Tool {
	return define(Tool{
		Name:  "sandbox_spawn_task",
		Title: "Run a command in a new, short-lived task sandbox",
		Description: "Run one command (or the agent's headless command with agent_args) in a fresh, transient sandbox made from the " +
			"project's runner image, then remove it (unless keep). It never touches the project VM. workspace \"copy\" (default) " +
			"gives the task a private copy of the checkout and returns the files it changed and a unified diff that `git apply` " +
			"takes in the checkout; \"mount\" shares the host checkout read-write; \"none\" gives an empty /workspace. " +
			"Safe to call many times in parallel. Builds the image first if needed (progress is reported). " +
			"With worktree (\"NAME[:BASE]\") the task works in that git worktree session of the project VM's home volume instead " +
			"(branch agents-sandbox/NAME; the host checkout is left untouched) and returns the session's state.",
		InputSchema: "sandbox_spawn_task.input.json", OutputSchema: "sandbox_spawn_task.output.json",
		Hints: Hints{ReadOnly: No, Destructive: No, Idempotent: No, OpenWorld: Yes},
	}, func(ctx context.Context, c Call, in *SpawnTaskInput) (SpawnTaskOutput, string, error) {
		const tool = "sandbox_spawn_task"
		env, err := parseEnv(tool, "/env", in.Env)
		if err != nil {
			return SpawnTaskOutput{}, "", err
		}
		if err := checkWorktree(tool, in.Worktree); err != nil {
			return SpawnTaskOutput{}, "", err
		}
		p, err := h.open(ctx, tool, in.Target)
		if err != nil {
			return SpawnTaskOutput{}, "", err
		}
		rep := newReporter(c)
		stdout, stderr := rep.writer("stdout: "), rep.writer("stderr: ")
		opts := sandbox.TaskOptions{Cmd: in.Cmd, AgentArgs: in.AgentArgs, Env: env, Timeout: seconds(in.TimeoutSeconds),
			Workspace: sandbox.WorkspaceMode(in.Workspace), Home: sandbox.HomeMode(in.Home), Keep: in.Keep,
			OutputCap: in.OutputCapBytes, Stdout: stdout, Stderr: stderr, Progress: rep.line, Worktree: in.Worktree}
		if in.Resources != nil {
			res := p.Config.Resources
			if in.Resources.CPUs != 0 {
				res.CPUs = in.Resources.CPUs
			}
			if in.Resources.Memory != "" {
				if _, err := sandbox.ParseBytes(in.Resources.Memory); err != nil {
					return SpawnTaskOutput{}, "", InvalidParams(tool, "/resources/memory", "%v", err)
				}
				res.Memory = in.Resources.Memory
			}
			if in.Resources.Pids != 0 {
				res.Pids = in.Resources.Pids
			}
			opts.Resources = &res
		}
		r, err := h.Core.SpawnTask(ctx, p, opts)
		stdout.flush()
		stderr.flush()
		if err != nil {
			return SpawnTaskOutput{}, "", worktreeError(tool, err)
		}
		out := SpawnTaskOutput{Name: r.Name, Kept: r.Kept, ExitCode: r.ExitCode, Stdout: streamOutput(r.Stdout), Stderr: streamOutput(r.Stderr),
			TimedOut: r.TimedOut, DurationMS: r.DurationMS, Workspace: r.Workspace, Changed: orEmpty(r.Changed), Diff: r.Diff, DiffTruncated: r.DiffTruncated}
		text := fmt.Sprintf("task %s exited %d after %d ms", r.Name, r.ExitCode, r.DurationMS)
		if r.TimedOut {
			text = fmt.Sprintf("task %s timed out after %d ms and was killed", r.Name, r.DurationMS)
		}
		if out.Workspace == string(sandbox.WorkspaceCopy) {
			text += "; " + plural(len(out.Changed), "file", "files") + " changed"
			if out.DiffTruncated {
				text += " (diff truncated)"
			}
		}
		if r.Worktree != nil {
			wi := worktreeInfo(*r.Worktree)
			out.Worktree = &wi
			text += fmt.Sprintf("; worktree session %s: %s, %d ahead and %d behind %s", wi.Name, wi.Branch, wi.Ahead, wi.Behind, wi.Base)
			if wi.Dirty {
				text += ", uncommitted changes"
			}
		}
		if r.Kept {
			text += "; kept (stopped) as " + r.Name
		}
		return out, text, nil
	})
}
