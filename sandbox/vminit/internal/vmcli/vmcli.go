// Package vmcli is a minimal command line (standard library flags) over
// package vminit, for the test helper binary and the tests that re-execute
// themselves. The product's commands are the cobra ones in cmd/agents-sandbox.
//
//	vm-init [--run-dir D] [--idle-timeout D] [--tick D] [--grace D] [-- CMD ARGS...]
//	vm-exec [--run-dir D] [--id ID] [--daemon] [--timeout D] [--kill-after D] [--workdir D] [--env K=V]... -- CMD ARGS...
//	vm-kill [--run-dir D] [--signal S] ID     (ID may also come first)
package vmcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
	"github.com/rs/zerolog"
)

// Main runs one subcommand and returns the process exit code (2 for usage
// errors, else the subcommand's).
func Main(ctx context.Context, args []string, stdin, stdout, stderr *os.File) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: vm-init|vm-exec|vm-kill [flags] ...")
		return 2
	}
	switch args[0] {
	case "vm-init":
		return initCmd(ctx, args[1:], stderr)
	case "vm-exec":
		return execCmd(ctx, args[1:], stdin, stdout, stderr)
	case "vm-kill":
		return killCmd(args[1:], stderr)
	}
	fmt.Fprintf(stderr, "unknown command %q\n", args[0])
	return 2
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func initCmd(ctx context.Context, args []string, stderr *os.File) int {
	fs := newFlags("vm-init", stderr)
	opts := vminit.InitOptions{Log: zerolog.New(stderr).With().Timestamp().Logger()}
	fs.StringVar(&opts.RunDir, "run-dir", vminit.DefaultRunDir, "run directory")
	idle := fs.String("idle-timeout", vminit.DefaultIdleTimeout.String(), "stop after this long without a session (0: never)")
	fs.DurationVar(&opts.Tick, "tick", vminit.DefaultTick, "check interval")
	fs.DurationVar(&opts.Grace, "grace", vminit.DefaultGrace, "SIGTERM to SIGKILL delay on stop")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	d, err := vminit.ParseIdleTimeout(*idle)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	opts.IdleTimeout = d
	opts.Command = fs.Args()
	return vminit.Init(ctx, opts)
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func execCmd(ctx context.Context, args []string, stdin, stdout, stderr *os.File) int {
	fs := newFlags("vm-exec", stderr)
	opts := vminit.ExecOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	var env multi
	fs.StringVar(&opts.RunDir, "run-dir", vminit.DefaultRunDir, "run directory")
	fs.StringVar(&opts.ID, "id", "", "session id")
	fs.BoolVar(&opts.Daemon, "daemon", false, "a server: not activity, leftovers kept")
	fs.DurationVar(&opts.Timeout, "timeout", 0, "kill the command after this long")
	fs.DurationVar(&opts.KillAfter, "kill-after", vminit.DefaultKillAfter, "SIGTERM to SIGKILL delay")
	fs.StringVar(&opts.WorkDir, "workdir", "", "working directory")
	fs.Var(&env, "env", "KEY=VALUE (repeatable)")
	if err := fs.Parse(args); err != nil {
		return vminit.ExitWrapperError
	}
	opts.Env = env
	opts.Args = fs.Args()
	return vminit.Exec(ctx, opts)
}

func killCmd(args []string, stderr *os.File) int {
	fs := newFlags("vm-kill", stderr)
	runDir := fs.String("run-dir", vminit.DefaultRunDir, "run directory")
	sigName := fs.String("signal", "TERM", "signal name or number")
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	} else if fs.NArg() > 0 || id == "" {
		fmt.Fprintln(stderr, "usage: vm-kill [--signal S] ID")
		return 2
	}
	sig, err := vminit.ParseSignal(*sigName)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if err := vminit.Kill(*runDir, id, sig); err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, vminit.ErrNoSession) {
			return 3
		}
		return 1
	}
	return 0
}
