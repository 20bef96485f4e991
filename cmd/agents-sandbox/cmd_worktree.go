package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// addWorktreeFlag registers --worktree NAME[:BASE] on a command that runs
// something in the VM.
func addWorktreeFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "worktree", "", "work in worktree session NAME inside the VM, on branch agents-sandbox/NAME started from BASE (default HEAD), and leave the host checkout untouched; the same NAME continues the session")
}

// checkWorktreeFlag parses --worktree early, so a bad NAME or BASE syntax
// fails before anything is built or started.
func checkWorktreeFlag(spec string) error {
	if spec == "" {
		return nil
	}
	_, err := sandbox.ParseWorktreeSpec(spec)
	return err
}

func newWorktreeCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worktree",
		Short: "List, diff, export and remove the worktree sessions inside the checkout's VM",
		Long: `A worktree session (run, attach, exec, shell or task with --worktree NAME[:BASE]) works
in a git worktree inside the VM, on its home volume, on branch agents-sandbox/NAME
started from BASE (default: the checkout's HEAD). The host checkout and its .git
are not written while it runs. Getting the work out is explicit: worktree diff
prints it, worktree export fetches its branch into the host repository.`,
	}
	cmd.AddCommand(newWorktreeLsCommand(a), newWorktreeDiffCommand(a), newWorktreeExportCommand(a), newWorktreeRmCommand(a))
	return cmd
}

func newWorktreeLsCommand(a *app) *cobra.Command {
	var f projectFlags
	var asJSON, noFetch bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the worktree sessions with branch, base, ahead/behind and dirty state",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			list, err := m.Worktrees(cmd.Context(), p, sandbox.WorktreeListOptions{Refresh: !noFetch})
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []sandbox.WorktreeSession{}
				}
				return writeJSON(a.streams.Out, list)
			}
			if len(list) == 0 {
				fmt.Fprintln(a.streams.Out, "no worktree sessions")
				return nil
			}
			tw := tabwriter.NewWriter(a.streams.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBRANCH\tBASE\tAHEAD\tBEHIND\tSTATE\tHEAD")
			for _, s := range list {
				state := "clean"
				switch {
				case s.Missing:
					state = "missing"
				case s.Dirty:
					state = "dirty"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", s.Name, s.Branch, s.Base, s.Ahead, s.Behind, state, short(s.Head))
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&noFetch, "no-fetch", false, "do not refresh the host's branches in the VM first (behind counts are then as of the last refresh)")
	return cmd
}

func newWorktreeDiffCommand(a *app) *cobra.Command {
	var f projectFlags
	cmd := &cobra.Command{
		Use:   "diff NAME",
		Short: "Print a unified diff of session NAME against its BASE (commits, uncommitted and untracked changes)",
		Long: `Print a unified diff (git format) of session NAME against its BASE: from where the
session left BASE to its worktree as it is now, committed, uncommitted and untracked
(not ignored) changes included. git apply takes it in a checkout at BASE.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			_, err = m.WorktreeDiff(cmd.Context(), p, args[0], a.streams.Out)
			return err
		},
	}
	f.register(cmd)
	return cmd
}

func newWorktreeExportCommand(a *app) *cobra.Command {
	var f projectFlags
	var force, asJSON bool
	cmd := &cobra.Command{
		Use:   "export NAME",
		Short: "Fetch session NAME's branch into the host repository as agents-sandbox/NAME",
		Long: `Fetch session NAME's branch, with its exact commits, into the host repository as
branch agents-sandbox/NAME. It is the only command that writes to the host's .git.
Only commits are exported: commit uncommitted changes in the session first.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			res, err := m.ExportWorktree(cmd.Context(), p, args[0], sandbox.ExportOptions{Force: force})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, res)
			}
			branch := sandbox.WorktreeBranchPrefix + args[0]
			if res.Updated {
				from := "new branch"
				if res.Previous != "" {
					from = "was " + short(res.Previous)
				}
				fmt.Fprintf(a.streams.Out, "%s -> %s (%s; %d commit(s) ahead of %s) in %s\n", branch, short(res.Commit), from, res.Session.Ahead, res.Session.Base, p.ID.GitCommonDir)
			} else {
				fmt.Fprintf(a.streams.Out, "%s is already at %s in %s\n", branch, short(res.Commit), p.ID.GitCommonDir)
			}
			if res.Uncommitted {
				fmt.Fprintf(a.streams.Err, "agents-sandbox: warning: session %s has uncommitted changes that were not exported; commit them in the session and export again\n", args[0])
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "replace the host's agents-sandbox/NAME even when the session's branch does not contain it (after a rebase)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func newWorktreeRmCommand(a *app) *cobra.Command {
	var f projectFlags
	var force bool
	cmd := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"remove"},
		Short:   "Remove session NAME (its worktree and branch in the VM; the host is not touched)",
		Long: `Remove session NAME from the VM: its worktree, its branch there and its record. An
exported agents-sandbox/NAME in the host repository stays. A session with
uncommitted changes or unexported commits is kept unless --force.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			if err := m.RemoveWorktree(cmd.Context(), p, args[0], sandbox.RemoveWorktreeOptions{Force: force}); err != nil {
				return err
			}
			fmt.Fprintf(a.streams.Out, "removed worktree session %s\n", args[0])
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove it even with uncommitted changes or unexported commits")
	return cmd
}

// short abbreviates a commit id for display.
func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	if id == "" {
		return "-"
	}
	return id
}
