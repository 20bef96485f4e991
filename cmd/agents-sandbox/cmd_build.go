package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

func newBuildCommand(a *app) *cobra.Command {
	var f projectFlags
	var rebuild bool
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build the checkout's runner image (skipped when nothing changed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			prog, done := a.progress()
			res, err := m.Build(cmd.Context(), p, rebuild, prog)
			done()
			if err != nil {
				return err
			}
			verb := "reused"
			if res.Built {
				verb = "built"
			}
			fmt.Fprintf(a.streams.Out, "%s %s (%s)\n", verb, res.Ref, res.Image.ID)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&rebuild, "rebuild", false, "build even when nothing changed")
	cmd.AddCommand(newBuildDockerfileCommand(a))
	return cmd
}

func newBuildDockerfileCommand(a *app) *cobra.Command {
	var f projectFlags
	cmd := &cobra.Command{
		Use:   "dockerfile",
		Short: "Print the Dockerfile the checkout's image is built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := f.dir
			if dir == "" {
				wd, err := os.Getwd()
				if err != nil {
					return err
				}
				dir = wd
			}
			m := &sandbox.Manager{Dirs: a.dirs, Environ: a.environ}
			p, err := m.Open(sandbox.OpenOptions{Dir: dir, Agent: f.agent})
			if err != nil {
				return err
			}
			uid, gid := sandbox.DevIDs(os.Getuid(), os.Getgid())
			plan, err := sandbox.PlanImage(p.ID, p.Config, p.Agent, uid, gid)
			if err != nil {
				return err
			}
			_, err = a.streams.Out.Write(plan.Dockerfile)
			return err
		},
	}
	f.register(cmd)
	return cmd
}

func newProvisionCommand(a *app) *cobra.Command {
	var f projectFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Sync the agent's merged config and the [home] mappings into the running VM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			res, err := m.Provision(cmd.Context(), p)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, res)
			}
			for _, w := range res.Written {
				fmt.Fprintf(a.streams.Out, "wrote     %s (%d bytes)\n", w.Path, w.Size)
			}
			for _, r := range res.Removed {
				fmt.Fprintf(a.streams.Out, "removed   %s\n", r)
			}
			fmt.Fprintf(a.streams.Out, "%d written, %d removed, %d unchanged\n", len(res.Written), len(res.Removed), len(res.Unchanged))
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
