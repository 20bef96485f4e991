package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

func newJSONEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc
}

func newStatusCommand(a *app) *cobra.Command {
	var f projectFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the state of the checkout's VM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			s, err := m.Status(cmd.Context(), p)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, s)
			}
			tw := tabwriter.NewWriter(a.streams.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "vm\t%s\nstate\t%s\nimage\t%s\nhome volume\t%s\n", s.VM, s.State, s.Image, s.HomeVolume)
			if !s.Created.IsZero() {
				fmt.Fprintf(tw, "created\t%s\n", s.Created.Local().Format(time.RFC3339))
			}
			if !s.LastUsed.IsZero() {
				fmt.Fprintf(tw, "last used\t%s\n", s.LastUsed.Local().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newStopCommand(a *app) *cobra.Command {
	var f projectFlags
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop",
		Short: "Stop the checkout's VM (its home volume stays)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			s, err := m.Stop(cmd.Context(), p, timeout)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.streams.Out, "%s: %s\n", s.VM, s.State)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "wait this long before killing")
	return cmd
}

func newKillCommand(a *app) *cobra.Command {
	var f projectFlags
	cmd := &cobra.Command{
		Use:   "kill",
		Short: "Kill the checkout's VM at once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			s, err := m.Kill(cmd.Context(), p)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.streams.Out, "%s: %s\n", s.VM, s.State)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newRemoveCommand(a *app) *cobra.Command {
	var f projectFlags
	var volume, yes, discard bool
	cmd := &cobra.Command{
		Use:     "remove",
		Aliases: []string{"rm"},
		Short:   "Remove the checkout's VM (and with --volume its home volume)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			if volume && !discard {
				// Worktree sessions live on the home volume: refuse to drop
				// work that exists nowhere else.
				if held := unexportedWork(cmd.Context(), m, p); len(held) > 0 {
					return fmt.Errorf("the home volume of %s holds worktree sessions with work not exported to the host: %s: %w: export them first (agents-sandbox worktree export NAME), or pass --discard-worktrees", p.Names.VM, strings.Join(held, "; "), sandbox.ErrConflict)
				}
			}
			if volume && !yes {
				if !a.isTerminal(a.streams.In) {
					return fmt.Errorf("--volume deletes the home volume of %s for good: %w: add --yes to confirm (no terminal to ask on)", p.Names.VM, sandbox.ErrInvalid)
				}
				s, err := m.Status(cmd.Context(), p)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.streams.Err, "Delete the home volume %q of %s for good? [y/N] ", s.HomeVolume, p.Names.VM)
				line, _ := bufio.NewReader(a.streams.In).ReadString('\n')
				if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
					return fmt.Errorf("not removed: the answer was not yes")
				}
			}
			res, err := m.Remove(cmd.Context(), p, volume)
			if err != nil {
				return err
			}
			if len(res.Removed) == 0 {
				fmt.Fprintln(a.streams.Out, "nothing to remove")
			}
			for _, r := range res.Removed {
				fmt.Fprintf(a.streams.Out, "removed %s\n", r)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&volume, "volume", false, "also delete the home volume (asks first on a terminal)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask before deleting the home volume")
	cmd.Flags().BoolVar(&discard, "discard-worktrees", false, "with --volume: delete worktree sessions with unexported work too")
	return cmd
}

func newListCommand(a *app) *cobra.Command {
	var f projectFlags
	var all, asJSON, running, stopped bool
	var kind string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the VMs and task sandboxes of this checkout (--all: of every checkout)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter := sandbox.ListFilter{Agent: f.agent, Kind: sandbox.Kind(kind)}
			if kind != "" && kind != string(sandbox.KindVM) && kind != string(sandbox.KindTask) {
				return fmt.Errorf("--kind %q: %w: use vm or task", kind, sandbox.ErrInvalid)
			}
			switch {
			case running && stopped:
				return fmt.Errorf("--running and --stopped: %w: pick one", sandbox.ErrInvalid)
			case running:
				filter.State = sandbox.VMRunning
			case stopped:
				filter.State = sandbox.VMStopped
			}
			var m *sandbox.Manager
			var err error
			if all {
				m, err = a.manager(cmd.Context())
			} else {
				var p *sandbox.Project
				m, p, err = a.open(cmd.Context(), projectFlags{dir: f.dir, set: f.set, inspect: true})
				if p != nil {
					filter.Checkout = p.ID.CheckoutSlug
				}
			}
			if err != nil {
				return err
			}
			items, err := m.List(cmd.Context(), filter)
			if err != nil {
				return err
			}
			if asJSON {
				if items == nil {
					items = []sandbox.Listed{}
				}
				return writeJSON(a.streams.Out, map[string]any{"items": items})
			}
			tw := tabwriter.NewWriter(a.streams.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tSTATUS\tAGENT\tCREATED\tLAST USED\tCHECKOUT")
			for _, it := range items {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", it.Name, it.Kind, it.State, it.Agent, ago(it.Created), ago(it.LastUsed), it.Dir)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&f.dir, "dir", "C", "", "checkout directory (default: the current directory)")
	cmd.Flags().StringVarP(&f.agent, "agent", "a", "", "only this agent")
	cmd.Flags().BoolVar(&all, "all", false, "every checkout, not only this one")
	cmd.Flags().StringVar(&kind, "kind", "", "only vm or task")
	cmd.Flags().BoolVar(&running, "running", false, "only running ones")
	cmd.Flags().BoolVar(&stopped, "stopped", false, "only stopped ones")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// parseAge parses "7d", "12h", "30m".
func parseAge(s string) (time.Duration, error) {
	if strings.HasSuffix(s, "d") {
		n, err := strconv.ParseFloat(strings.TrimSuffix(s, "d"), 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("--age %q: %w: use a duration like 7d, 12h or 30m", s, sandbox.ErrInvalid)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("--age %q: %w: use a duration like 7d, 12h or 30m", s, sandbox.ErrInvalid)
	}
	return d, nil
}

func humanBytes(n int64) string {
	if n < 0 {
		return "?"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func newPruneCommand(a *app) *cobra.Command {
	var age, dir string
	var dry, volumes, asJSON bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove stopped task sandboxes, unused VMs and images, found by our labels only",
		Long: `Remove what agents-sandbox made and no longer needs, on every checkout (or with
--dir only that checkout's), found by our labels only: stopped task sandboxes and
running ones whose spawner died, VMs unused for longer than --age (their home
volumes only with --volumes), runner images no VM uses, secret proxies left
running by VMs that stopped when idle, unused proxy images (without --dir), and
dangling layers of our builds. Images built in the last 10 minutes are left to
the run that is about to use them. Nothing else on the engine is touched. It
prints what it removed (or with --dry-run what it would remove) and the space
freed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := parseAge(age)
			if err != nil {
				return err
			}
			o := sandbox.PruneOptions{Age: d, DryRun: dry, Volumes: volumes}
			var m *sandbox.Manager
			if dir != "" {
				var p *sandbox.Project
				m, p, err = a.open(cmd.Context(), projectFlags{dir: dir, inspect: true})
				if err != nil {
					return err
				}
				o.Checkout = p.ID.CheckoutSlug
			} else if m, err = a.manager(cmd.Context()); err != nil {
				return err
			}
			res, err := m.Prune(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, res)
			}
			verb := "removed"
			if dry {
				verb = "would remove"
			}
			for _, r := range res.Removed {
				fmt.Fprintf(a.streams.Out, "%s %s %s (%s; %s)\n", verb, r.Kind, r.Name, r.Reason, humanBytes(r.Bytes))
			}
			freed := "freed"
			if dry {
				freed = "would be freed"
			}
			fmt.Fprintf(a.streams.Out, "%d item(s), %s %s\n", len(res.Removed), humanBytes(res.BytesFreed), freed)
			return nil
		},
	}
	cmd.Flags().StringVar(&age, "age", "7d", "remove VMs unused for longer than this")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "print what would be removed, change nothing")
	cmd.Flags().BoolVar(&volumes, "volumes", false, "also remove the home volumes of pruned VMs, and home volumes unused for longer than --age")
	cmd.Flags().StringVarP(&dir, "dir", "C", "", "only the artifacts of the checkout at this directory (default: every checkout)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newTaskCommand(a *app) *cobra.Command {
	var f projectFlags
	var workspace, home, worktree string
	var keep, asJSON bool
	var timeout time.Duration
	var env []string
	cmd := &cobra.Command{
		Use:   "task [flags] [-- CMD ARGS...]",
		Short: "Run one command (or the agent headless) in a short-lived sandbox",
		Long: `Run one command in a new task sandbox made from the checkout's image, then remove
it. With --workspace copy (the default) the task works on a private copy of the
checkout and the result includes the files it changed and a diff you can apply
with git apply. Without CMD the agent's headless command runs with --prompt.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			if err := checkWorktreeFlag(worktree); err != nil {
				return err
			}
			o := sandbox.TaskOptions{Cmd: args, Timeout: timeout, Workspace: sandbox.WorkspaceMode(workspace), Home: sandbox.HomeMode(home), Keep: keep, Env: map[string]string{}, Worktree: worktree}
			if worktree != "" {
				// A worktree task works in its session on the project's
				// home volume: the copy/fresh defaults do not apply.
				if !cmd.Flags().Changed("workspace") {
					o.Workspace = ""
				}
				if !cmd.Flags().Changed("home") {
					o.Home = ""
				}
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--env %q: %w: use KEY=VALUE", kv, sandbox.ErrInvalid)
				}
				o.Env[k] = v
			}
			if !asJSON {
				o.Stdout, o.Stderr = a.streams.Out, a.streams.Err
				o.OutputCap = 1
			}
			prog, done := a.progress()
			o.Progress = prog
			res, err := m.SpawnTask(cmd.Context(), p, o)
			done()
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(a.streams.Out, res); err != nil {
					return err
				}
			} else {
				if res.TimedOut {
					fmt.Fprintf(a.streams.Err, "agents-sandbox: task %s timed out after %s and was killed\n", res.Name, timeout)
				}
				if len(res.Changed) > 0 {
					fmt.Fprintf(a.streams.Err, "agents-sandbox: the task changed %d file(s): %s (use --json for the diff)\n", len(res.Changed), strings.Join(res.Changed, ", "))
				}
				if res.Kept {
					fmt.Fprintf(a.streams.Err, "agents-sandbox: kept task sandbox %s\n", res.Name)
				}
			}
			if res.ExitCode != 0 {
				return exitError{code: res.ExitCode}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&workspace, "workspace", "copy", "how the task sees the checkout: copy, mount or none")
	cmd.Flags().StringVar(&home, "home", "fresh", "the task's home: fresh or readonly (the VM's home volume, read-only)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the task sandbox afterwards (stopped)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "kill the task after this long (0: never)")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "set an environment variable KEY=VALUE (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "capture output and print the result (with the diff) as JSON")
	addWorktreeFlag(cmd, &worktree)
	return cmd
}

// unexportedWork lists the worktree sessions in the project's VM whose work
// exists only there: uncommitted changes, or commits the host's branch
// agents-sandbox/NAME does not point at. A VM that is missing has none.
func unexportedWork(ctx context.Context, m *sandbox.Manager, p *sandbox.Project) []string {
	if !p.ID.Git {
		return nil
	}
	sessions, err := m.Worktrees(ctx, p, sandbox.WorktreeListOptions{})
	if err != nil {
		return nil
	}
	var held []string
	for _, s := range sessions {
		exported := false
		if out, err := exec.CommandContext(ctx, "git", "-C", p.ID.Dir, "rev-parse", "-q", "--verify", "refs/heads/"+s.Branch).Output(); err == nil {
			exported = strings.TrimSpace(string(out)) == s.Head
		}
		switch {
		case s.Dirty:
			held = append(held, s.Name+" (uncommitted changes)")
		case s.Ahead > 0 && !exported:
			held = append(held, fmt.Sprintf("%s (%d commits not exported)", s.Name, s.Ahead))
		}
	}
	return held
}
