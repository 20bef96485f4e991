package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// Streams are the standard streams a command uses; injected so commands are
// testable.
type Streams struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = "devel-" + s.Value[:12]
			}
		}
		if v != "" && v != "(devel)" {
			return v
		}
	}
	return "devel"
}

// app is what every command shares: streams, environment, logger and global
// flags. It is built once per invocation in Main.
type app struct {
	streams  Streams
	environ  []string
	log      zerolog.Logger
	logLevel string
	dirs     sandbox.Dirs
	rt       sandbox.Runtime
}

func (a *app) getenv(k string) string {
	for i := len(a.environ) - 1; i >= 0; i-- {
		if name, val, ok := strings.Cut(a.environ[i], "="); ok && name == k {
			return val
		}
	}
	return ""
}

// exitError carries an exit code out of a command without printing more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Main runs the CLI with args (without the program name) and returns the
// process exit code. Errors are printed once to streams.Err as
// "agents-sandbox: <message>", never with a stack trace.
func Main(ctx context.Context, args []string, streams Streams, environ []string) int {
	a := &app{streams: streams, environ: environ}
	root := newRootCommand(a)
	root.SetArgs(args)
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.Err)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(streams.Err, "agents-sandbox: %s\n", err)
	if errors.Is(err, sandbox.ErrInvalid) || isUsageError(err) {
		return 2
	}
	return 1
}

func isUsageError(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.Contains(s, "accepts ") ||
		strings.HasPrefix(s, "invalid argument") || strings.HasPrefix(s, "flag needs an argument")
}

func newRootCommand(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "agents-sandbox",
		Short: "Give an AI coding agent its own machine for one project checkout",
		Long: `agents-sandbox gives an AI coding agent (opencode, Claude Code, Codex, or one you
define) its own machine for one project checkout: built from a Dockerfile, with a
persistent home volume, the checkout at /workspace, and secrets the agent never
holds (it sees placeholders; a host-side proxy swaps in the real value only for
allowed hosts).

Run "agents-sandbox run" in a checkout to start the default agent there.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setup()
		},
	}
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "", "log level: trace, debug, info, warn, error (env AGENTS_SANDBOX_LOG_LEVEL; default warn)")
	root.AddCommand(
		newVersionCommand(a),
		newIdentityCommand(a),
		newConfigCommand(a),
		newDoctorCommand(a),
		newRunCommand(a),
		newCreateCommand(a),
		newAttachCommand(a),
		newShellCommand(a),
		newExecCommand(a),
		newStatusCommand(a),
		newStopCommand(a),
		newKillCommand(a),
		newRemoveCommand(a),
		newListCommand(a),
		newPruneCommand(a),
		newTaskCommand(a),
		newBuildCommand(a),
		newProvisionCommand(a),
		newMigrateCommand(a),
		newTrustCommand(a),
		newMCPCommand(a),
		newServeCommand(a),
		newProxyCommand(a),
		newWorktreeCommand(a),
		newVMInitCommand(a),
		newVMExecCommand(a),
		newVMKillCommand(a),
		newVMStatusCommand(a),
	)
	return root
}

// setup builds the logger and directories once flags are parsed.
func (a *app) setup() error {
	lvlName := a.logLevel
	if lvlName == "" {
		lvlName = a.getenv("AGENTS_SANDBOX_LOG_LEVEL")
	}
	if lvlName == "" {
		lvlName = "warn"
	}
	lvl, err := zerolog.ParseLevel(strings.ToLower(lvlName))
	if err != nil || lvlName == "" {
		return fmt.Errorf("--log-level %q: %w: use trace, debug, info, warn or error", lvlName, sandbox.ErrInvalid)
	}
	var w io.Writer = a.streams.Err
	if f, ok := a.streams.Err.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		w = zerolog.ConsoleWriter{Out: f, TimeFormat: "15:04:05"}
	}
	a.log = zerolog.New(w).Level(lvl).With().Timestamp().Logger()
	dirs, err := sandbox.DefaultDirs(a.getenv)
	if err != nil {
		return err
	}
	a.dirs = dirs
	return nil
}

func newVersionCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(a.streams.Out, "agents-sandbox %s\n", buildVersion())
			return nil
		},
	}
}
