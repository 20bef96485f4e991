package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// projectFlags are the flags every project command takes.
type projectFlags struct {
	dir   string
	agent string
	set   []string // KEY=VALUE config overrides
	trust bool
	// inspect marks commands that only look at or stop things: they skip
	// the project-configuration trust check.
	inspect bool
	// dryRun: change nothing (migration reports what it would do).
	dryRun bool
	// noMigrate: the command runs the migration itself.
	noMigrate bool
}

func (f *projectFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.dir, "dir", "C", "", "checkout directory (default: the current directory)")
	cmd.Flags().StringVarP(&f.agent, "agent", "a", "", "agent to use (default: the configured agent)")
	cmd.Flags().StringArrayVar(&f.set, "set", nil, "override a config key, e.g. --set resources.cpus=2 (repeatable)")
	cmd.Flags().BoolVar(&f.trust, "trust", false, "accept the checkout's own secrets, home mappings, mounts and egress settings (see: agents-sandbox trust --help)")
}

// manager builds the Manager for this invocation.
func (a *app) manager(ctx context.Context) (*sandbox.Manager, error) {
	rt, err := a.runtime(ctx)
	if err != nil {
		return nil, err
	}
	m, err := sandbox.NewManager(rt, a.dirs, a.log)
	if err != nil {
		return nil, err
	}
	m.Environ = a.environ
	if bin := a.getenv("AGENTS_SANDBOX_BIN"); bin != "" {
		m.InitBinary = bin
	}
	return m, nil
}

// open resolves the project of the flags.
func (a *app) open(ctx context.Context, f projectFlags) (*sandbox.Manager, *sandbox.Project, error) {
	dir := f.dir
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, nil, fmt.Errorf("current directory: %w", err)
		}
		dir = wd
	}
	flags := map[string]string{}
	for _, kv := range f.set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, nil, fmt.Errorf("--set %q: %w: use KEY=VALUE, e.g. --set resources.cpus=2", kv, sandbox.ErrInvalid)
		}
		flags[k] = v
	}
	m, err := a.manager(ctx)
	if err != nil {
		return nil, nil, err
	}
	opts := sandbox.OpenOptions{Dir: dir, Agent: f.agent, Flags: flags, Trust: f.trust, SkipTrust: f.inspect}
	if f.noMigrate {
		p, err := m.Open(opts)
		return m, p, err
	}
	p, rep, err := m.OpenProject(ctx, opts, f.dryRun)
	for _, w := range rep.Warnings {
		fmt.Fprintf(a.streams.Err, "agents-sandbox: warning: %s\n", w)
	}
	if err != nil {
		return nil, nil, err
	}
	return m, p, nil
}

func (a *app) isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress returns a ProgressFunc that shows build output on stderr: one
// line rewritten in place on a terminal, plain lines otherwise (only at
// info level and below, so scripts stay quiet).
func (a *app) progress() (sandbox.ProgressFunc, func()) {
	var mu sync.Mutex
	if a.isTerminal(a.streams.Err) {
		width := 100
		if f, ok := a.streams.Err.(*os.File); ok {
			if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 10 {
				width = w - 1
			}
		}
		shown := false
		return func(line string) {
				line = strings.TrimSpace(strings.ReplaceAll(line, "\r", ""))
				if line == "" {
					return
				}
				if len(line) > width {
					line = line[:width]
				}
				mu.Lock()
				fmt.Fprintf(a.streams.Err, "\r\033[K\033[2m%s\033[0m", line)
				shown = true
				mu.Unlock()
			}, func() {
				mu.Lock()
				if shown {
					fmt.Fprint(a.streams.Err, "\r\033[K")
				}
				mu.Unlock()
			}
	}
	return func(line string) {
		if a.log.GetLevel() > -1 && a.log.GetLevel() > 1 {
			return
		}
		mu.Lock()
		fmt.Fprintln(a.streams.Err, strings.TrimRight(line, "\n"))
		mu.Unlock()
	}, func() {}
}

func newRunCommand(a *app) *cobra.Command {
	var f projectFlags
	var rebuild bool
	var worktree string
	cmd := &cobra.Command{
		Use:   "run [flags] [-- AGENT ARGS...]",
		Short: "Build, create or reuse the checkout's VM and attach the agent (the main job)",
		Long: `Build the image (skipped when nothing changed), create or reuse the home volume and
the VM, provision the agent's config, and attach the agent in the directory under
/workspace matching where you stand. Arguments after -- go to the agent.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkWorktreeFlag(worktree); err != nil {
				return err
			}
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			if f.dryRun {
				return a.printPlan(cmd.Context(), m, p, rebuild, false)
			}
			if _, err := a.create(cmd.Context(), m, p, rebuild); err != nil {
				return err
			}
			return a.attach(cmd.Context(), m, p, sandbox.AttachOptions{Args: args, Worktree: worktree})
		},
	}
	f.register(cmd)
	addWorktreeFlag(cmd, &worktree)
	cmd.Flags().BoolVar(&rebuild, "rebuild", false, "build the image even when nothing changed")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "print what the run would do (migration included) and change nothing")
	return cmd
}

// printPlan prints what Create would do, changing nothing.
func (a *app) printPlan(ctx context.Context, m *sandbox.Manager, p *sandbox.Project, rebuild, asJSON bool) error {
	plan, err := m.PlanCreate(ctx, p, sandbox.CreateOptions{Rebuild: rebuild})
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(a.streams.Out, plan)
	}
	fmt.Fprintf(a.streams.Out, "dry run for %s (agent %s): nothing was changed\n", p.ID.ProjectDir, p.Names.Agent)
	if len(plan.Changes) == 0 {
		fmt.Fprintln(a.streams.Out, "  nothing to do: everything is up to date")
	}
	for _, c := range plan.Changes {
		fmt.Fprintf(a.streams.Out, "  - %s\n", c)
	}
	for _, w := range plan.Warnings {
		fmt.Fprintf(a.streams.Err, "agents-sandbox: warning: %s\n", w)
	}
	return nil
}

func (a *app) create(ctx context.Context, m *sandbox.Manager, p *sandbox.Project, rebuild bool) (sandbox.CreateResult, error) {
	prog, done := a.progress()
	res, err := m.Create(ctx, p, sandbox.CreateOptions{Rebuild: rebuild, Progress: prog})
	done()
	if err != nil {
		return res, err
	}
	for _, w := range res.Warnings {
		a.log.Warn().Msg(w)
	}
	a.log.Info().Str("vm", res.VM).Str("action", string(res.Action)).Bool("image_built", res.ImageBuilt).Interface("timings_ms", res.TimingsMS).Msg("VM ready")
	return res, nil
}

func newCreateCommand(a *app) *cobra.Command {
	var f projectFlags
	var rebuild, asJSON bool
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Build the image and create or start the checkout's VM, without attaching",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			if f.dryRun {
				return a.printPlan(cmd.Context(), m, p, rebuild, asJSON)
			}
			res, err := a.create(cmd.Context(), m, p, rebuild)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, res)
			}
			fmt.Fprintf(a.streams.Out, "%s %s (image %s%s, home %s) in %d ms\n", res.Action, res.VM, res.Image,
				map[bool]string{true: ", built", false: ""}[res.ImageBuilt], res.HomeVolume, res.TimingsMS["total"])
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&rebuild, "rebuild", false, "build the image even when nothing changed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "print what create would do (migration included) and change nothing")
	return cmd
}

func newAttachCommand(a *app) *cobra.Command {
	var f projectFlags
	var worktree string
	cmd := &cobra.Command{
		Use:   "attach [flags] [-- AGENT ARGS...]",
		Short: "Attach the agent in the checkout's running VM",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkWorktreeFlag(worktree); err != nil {
				return err
			}
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			return a.attach(cmd.Context(), m, p, sandbox.AttachOptions{Args: args, Worktree: worktree})
		},
	}
	f.register(cmd)
	addWorktreeFlag(cmd, &worktree)
	return cmd
}

func newShellCommand(a *app) *cobra.Command {
	var f projectFlags
	var root bool
	var worktree string
	cmd := &cobra.Command{
		Use:   "shell [flags] [-- CMD...]",
		Short: "Open a login shell (or run CMD) in the checkout's VM, creating it if needed",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkWorktreeFlag(worktree); err != nil {
				return err
			}
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			if _, err := a.create(cmd.Context(), m, p, false); err != nil {
				return err
			}
			c := []string{"bash", "-l"}
			if len(args) > 0 {
				c = args
			}
			o := sandbox.ExecOptions{Cmd: c, Worktree: worktree}
			if root {
				o.User = "0:0"
			}
			return a.interactiveExec(cmd.Context(), m, p, o, true)
		},
	}
	f.register(cmd)
	addWorktreeFlag(cmd, &worktree)
	cmd.Flags().BoolVar(&root, "root", false, "run as root instead of the VM's user")
	return cmd
}

// attach runs the agent's attach command, interactive when stdin is a terminal.
func (a *app) attach(ctx context.Context, m *sandbox.Manager, p *sandbox.Project, o sandbox.AttachOptions) error {
	tty := a.isTerminal(a.streams.In) && a.isTerminal(a.streams.Out)
	o.Stdin, o.Stdout, o.Stderr, o.TTY = a.streams.In, a.streams.Out, a.streams.Err, tty
	o.OutputCap = 1
	restore, resize := a.rawTerminal(tty)
	defer restore()
	o.Resize = resize
	res, err := m.Attach(ctx, p, o)
	restore()
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return exitError{code: res.ExitCode}
	}
	return nil
}

// interactiveExec runs a command with the caller's terminal.
func (a *app) interactiveExec(ctx context.Context, m *sandbox.Manager, p *sandbox.Project, o sandbox.ExecOptions, stdin bool) error {
	tty := stdin && a.isTerminal(a.streams.In) && a.isTerminal(a.streams.Out)
	if stdin {
		o.Stdin = a.streams.In
	}
	o.Stdout, o.Stderr, o.TTY, o.OutputCap = a.streams.Out, a.streams.Err, tty, 1
	restore, resize := a.rawTerminal(tty)
	defer restore()
	o.Resize = resize
	res, err := m.Exec(ctx, p, o)
	restore()
	if err != nil {
		return err
	}
	if res.TimedOut {
		fmt.Fprintf(a.streams.Err, "agents-sandbox: the command timed out after %s and was killed\n", o.Timeout)
	}
	if res.ExitCode != 0 {
		return exitError{code: res.ExitCode}
	}
	return nil
}

// rawTerminal puts stdin in raw mode and follows window size changes.
func (a *app) rawTerminal(tty bool) (func(), <-chan sandbox.TermSize) {
	if !tty {
		return func() {}, nil
	}
	in := a.streams.In.(*os.File)
	out := a.streams.Out.(*os.File)
	state, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return func() {}, nil
	}
	ch := make(chan sandbox.TermSize, 4)
	send := func() {
		if w, h, err := term.GetSize(int(out.Fd())); err == nil {
			select {
			case ch <- sandbox.TermSize{Rows: uint16(h), Cols: uint16(w)}:
			default:
			}
		}
	}
	send()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGWINCH)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				send()
			case <-stop:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(sig)
			close(stop)
			_ = term.Restore(int(in.Fd()), state)
		})
	}, ch
}

func newExecCommand(a *app) *cobra.Command {
	var f projectFlags
	var interactive, tty, root, asJSON bool
	var timeout time.Duration
	var user, workdir, worktree string
	var env []string
	cmd := &cobra.Command{
		Use:   "exec [flags] -- CMD [ARGS...]",
		Short: "Run a command in the checkout's VM",
		Long: `Run a command in the checkout's VM (which must exist: see create) and exit with
its exit code. The command runs in its own process group; --timeout kills the
whole group and exits 124.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkWorktreeFlag(worktree); err != nil {
				return err
			}
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			o := sandbox.ExecOptions{Cmd: args, Timeout: timeout, User: user, WorkDir: workdir, Env: map[string]string{}, Worktree: worktree}
			if root {
				o.User = "0:0"
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--env %q: %w: use KEY=VALUE", kv, sandbox.ErrInvalid)
				}
				o.Env[k] = v
			}
			if asJSON {
				if interactive {
					o.Stdin = a.streams.In
				}
				res, err := m.Exec(cmd.Context(), p, o)
				if err != nil {
					return err
				}
				if err := writeJSON(a.streams.Out, res); err != nil {
					return err
				}
				if res.ExitCode != 0 {
					return exitError{code: res.ExitCode}
				}
				return nil
			}
			if tty && !interactive {
				interactive = true
			}
			return a.interactiveExec(cmd.Context(), m, p, o, interactive)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "pass stdin to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "allocate a terminal (implies -i when stdin is one)")
	cmd.Flags().BoolVar(&root, "root", false, "run as root")
	cmd.Flags().StringVarP(&user, "user", "u", "", "user to run as (default: the VM's user)")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the VM (default: where you stand, under /workspace)")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "set an environment variable KEY=VALUE (repeatable)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "kill the command after this long, e.g. 30s (0: never)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "capture the output and print the result as JSON")
	addWorktreeFlag(cmd, &worktree)
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := newJSONEncoder(w)
	return enc.Encode(v)
}
