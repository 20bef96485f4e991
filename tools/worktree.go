package tools

import (
	"context"
	"errors"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// WorktreeLister lists the worktree sessions in a project's VM
// (sandbox_status). *sandbox.Manager implements it.
type WorktreeLister interface {
	Worktrees(ctx context.Context, p *sandbox.Project, o sandbox.WorktreeListOptions) ([]sandbox.WorktreeSession, error)
}

var _ WorktreeLister = (*sandbox.Manager)(nil)

// WorktreeInfo is one worktree session inside the VM.
type WorktreeInfo struct {
	Name       string `json:"name"`
	Branch     string `json:"branch"`
	Path       string `json:"path"`
	Base       string `json:"base"`
	BaseCommit string `json:"base_commit"`
	BaseRef    string `json:"base_ref,omitempty"`
	Head       string `json:"head"`
	Ahead      int    `json:"ahead"`
	Behind     int    `json:"behind"`
	Dirty      bool   `json:"dirty"`
	Missing    bool   `json:"missing"`
}

func worktreeInfo(s sandbox.WorktreeSession) WorktreeInfo {
	return WorktreeInfo{Name: s.Name, Branch: s.Branch, Path: s.Path, Base: s.Base, BaseCommit: s.BaseCommit, BaseRef: s.BaseRef,
		Head: s.Head, Ahead: s.Ahead, Behind: s.Behind, Dirty: s.Dirty, Missing: s.Missing}
}

// StatusToolOutput is sandbox_status's output: the VM's state and, while it
// runs, its worktree sessions.
type StatusToolOutput struct {
	StatusOutput
	Worktrees []WorktreeInfo `json:"worktrees,omitempty"`
}

// checkWorktree checks the syntax of a worktree argument ("NAME[:BASE]").
func checkWorktree(tool, spec string) error {
	if spec == "" {
		return nil
	}
	if _, err := sandbox.ParseWorktreeSpec(spec); err != nil {
		e := InvalidParams(tool, "/worktree", "%s", err.Error())
		e.Err = err
		return e
	}
	return nil
}

// worktreeError turns the core's invalid-worktree errors (a BASE that does
// not exist, say) into invalid params at /worktree; others pass.
func worktreeError(tool string, err error) error {
	if errors.Is(err, sandbox.ErrBadWorktree) {
		e := InvalidParams(tool, "/worktree", "%s", err.Error())
		e.Err = err
		return e
	}
	return err
}

// statusWorktrees lists the sessions of a running VM for sandbox_status,
// without starting anything; a failure becomes a warning.
func (h *handlers) statusWorktrees(ctx context.Context, p *sandbox.Project, s sandbox.Status) []WorktreeInfo {
	if h.Worktrees == nil || s.State != sandbox.VMRunning || !p.ID.Git {
		return nil
	}
	list, err := h.Worktrees.Worktrees(ctx, p, sandbox.WorktreeListOptions{NoStart: true})
	if err != nil {
		addWarnings(ctx, []string{"could not list the worktree sessions: " + err.Error()})
		return nil
	}
	out := make([]WorktreeInfo, 0, len(list))
	for _, s := range list {
		out = append(out, worktreeInfo(s))
	}
	return out
}

// Worktrees lists the worktree sessions once the engine answers.
func (l *LazyManager) Worktrees(ctx context.Context, p *sandbox.Project, o sandbox.WorktreeListOptions) ([]sandbox.WorktreeSession, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return nil, err
	}
	return m.Worktrees(ctx, p, o)
}

var _ WorktreeLister = (*LazyManager)(nil)
