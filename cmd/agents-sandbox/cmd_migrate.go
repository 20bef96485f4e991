package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// newMigrateCommand is `agents-sandbox migrate [--dry-run] [--json]`: the
// migration from the origin-keyed layout on its own (every project command
// runs it first anyway).
func newMigrateCommand(a *app) *cobra.Command {
	var f projectFlags
	var dryRun, asJSON bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move this checkout's artifacts out of the origin-keyed layout of an earlier version",
		Long: `An earlier agents-sandbox keyed everything by the checkout's origin remote: the
state dir <state>/<repo-slug>/ and the VM agents-sandbox-<repo-slug>-<agent>, shared
by every clone of the remote. Every project command migrates that layout to the
checkout's own before it does anything else; this command does only that and
prints what it did.

The migration keeps the home volume (it is recorded in the checkout's state),
destroys the legacy VM, and moves the legacy state dir's files into the
checkout's, never replacing a file the checkout already has: such files, and
any that cannot move, are reported and left where they are. The first clone to
run migrates the shared layout; the others find nothing left to migrate.

--dry-run reports what the migration would do and changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect, f.noMigrate = true, true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			rep, err := a.migrateFirst(cmd.Context(), m, p, dryRun)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, rep)
			}
			printMigration(a.streams.Out, rep)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be done and change nothing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// migrateFirst runs the migration from the origin-keyed layout for p (a
// dry run with dryRun) and prints its warnings on stderr, never prompting.
// Every project command calls it right after opening the project.
func (a *app) migrateFirst(ctx context.Context, m *sandbox.Manager, p *sandbox.Project, dryRun bool) (sandbox.MigrationReport, error) {
	rep, err := m.Migrate(ctx, p, sandbox.MigrateOptions{DryRun: dryRun})
	for _, w := range rep.Warnings {
		fmt.Fprintf(a.streams.Err, "agents-sandbox: warning: %s\n", w)
	}
	return rep, err
}

// printMigration prints a migration report for people, one action a line.
func printMigration(w io.Writer, rep sandbox.MigrationReport) {
	switch {
	case rep.RepoSlug == "":
		fmt.Fprintln(w, "nothing to migrate: this checkout has no origin remote, so it never had an origin-keyed layout")
		return
	case !rep.Found:
		fmt.Fprintf(w, "nothing to migrate: no origin-keyed layout of %s is left (%s)\n", rep.RepoSlug, rep.LegacyStateDir)
		return
	}
	verb := "migrated"
	if rep.DryRun {
		verb = "would migrate"
	}
	fmt.Fprintf(w, "%s the origin-keyed layout of %s into %s\n", verb, rep.RepoSlug, rep.StateDir)
	for _, act := range rep.Actions {
		line := fmt.Sprintf("  %-13s %s", act.Step, act.Target)
		if act.Agent != "" {
			line += " (" + act.Agent + ")"
		}
		if act.Detail != "" {
			line += ": " + act.Detail
		}
		fmt.Fprintln(w, line)
	}
	for _, k := range rep.Kept {
		fmt.Fprintf(w, "  %-13s %s: %s\n", "kept", k.Path, k.Reason)
	}
	if !rep.Complete {
		fmt.Fprintf(w, "%s stays until what is kept is moved or removed by hand; the next run tries again\n", rep.LegacyStateDir)
	}
}
