package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
)

// The vm-* commands run inside a VM: agents-sandbox copies its own binary
// there and uses it as the VM's init and as the wrapper of every command.
// They are hidden from help.

func newVMInitCommand(a *app) *cobra.Command {
	var idle string
	var runDir string
	cmd := &cobra.Command{
		Use:    "vm-init [--idle-timeout D] [-- CMD...]",
		Short:  "Inside a VM: PID 1 (reaps zombies, stops the VM when idle)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := vminit.ParseIdleTimeout(idle)
			if err != nil {
				return fmt.Errorf("--idle-timeout: %w: %w", sandbox.ErrInvalid, err)
			}
			// Signals are Init's to handle (forwarding, grace): the process's
			// signal context must not cancel it.
			log := a.log
			if a.logLevel == "" && a.getenv("AGENTS_SANDBOX_LOG_LEVEL") == "" {
				log = log.Level(zerolog.InfoLevel)
			}
			code := vminit.Init(context.WithoutCancel(cmd.Context()), vminit.InitOptions{RunDir: runDir, IdleTimeout: d, Command: args, Log: log})
			if code != 0 {
				return exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&idle, "idle-timeout", "30m", "stop when no session was alive for this long (0: never)")
	cmd.Flags().StringVar(&runDir, "run-dir", "", "session directory (default /run/agents-sandbox)")
	return cmd
}

func newVMExecCommand(a *app) *cobra.Command {
	var o vminit.ExecOptions
	cmd := &cobra.Command{
		Use:    "vm-exec [--id ID] [--daemon] [--timeout D] -- CMD...",
		Short:  "Inside a VM: run a command in its own process group as a session",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Args = args
			o.Log = a.log
			// SIGINT and friends are forwarded to the command by Exec; the
			// signal context must not also kill its process group.
			code := vminit.Exec(context.WithoutCancel(cmd.Context()), o)
			if code != 0 {
				return exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.ID, "id", "", "session id")
	cmd.Flags().BoolVar(&o.Daemon, "daemon", false, "a background service: does not keep the VM busy")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, "kill the process group after this long")
	cmd.Flags().DurationVar(&o.WaitTTYSize, "wait-tty-size", 0, "wait up to this long for the terminal to get a size before starting")
	cmd.Flags().StringVar(&o.WorkDir, "workdir", "", "working directory")
	cmd.Flags().StringArrayVar(&o.Env, "env", nil, "KEY=VALUE to add to the environment")
	cmd.Flags().StringVar(&o.RunDir, "run-dir", "", "session directory (default /run/agents-sandbox)")
	return cmd
}

func newVMKillCommand(a *app) *cobra.Command {
	var sig, runDir string
	cmd := &cobra.Command{
		Use:    "vm-kill ID",
		Short:  "Inside a VM: kill a session's process group",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := vminit.ParseSignal(sig)
			if err != nil {
				return fmt.Errorf("--signal: %w: %w", sandbox.ErrInvalid, err)
			}
			return vminit.Kill(runDir, args[0], s)
		},
	}
	cmd.Flags().StringVar(&sig, "signal", "KILL", "signal to send")
	cmd.Flags().StringVar(&runDir, "run-dir", "", "session directory (default /run/agents-sandbox)")
	return cmd
}

func newVMStatusCommand(a *app) *cobra.Command {
	var runDir string
	cmd := &cobra.Command{
		Use:    "vm-status",
		Short:  "Inside a VM: print the init's status as JSON",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := vminit.ReadStatus(runDir)
			if err != nil {
				return err
			}
			return json.NewEncoder(a.streams.Out).Encode(st)
		},
	}
	cmd.Flags().StringVar(&runDir, "run-dir", "", "session directory (default /run/agents-sandbox)")
	return cmd
}
