package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// project is a resolved checkout with its merged configuration.
type project struct {
	ID     sandbox.Identity
	Config sandbox.LoadedConfig
	Agent  string
	Names  sandbox.Names
}

// resolveProject resolves dir (cwd when empty), loads the configuration with
// flag overrides and picks the agent (agentFlag wins over config).
func (a *app) resolveProject(dir string, flags map[string]string) (*project, error) {
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("current directory: %w", err)
		}
		dir = wd
	}
	id, err := sandbox.Resolve(dir)
	if err != nil {
		return nil, err
	}
	lc, err := sandbox.LoadConfig(sandbox.SourcesFor(id, a.dirs, a.environ, flags))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrInvalid, err)
	}
	agent := lc.Config.Agent
	return &project{ID: id, Config: lc, Agent: agent, Names: id.Names(agent, a.dirs)}, nil
}

type identityOutput struct {
	sandbox.Identity
	Agent  string            `json:"agent"`
	Names  sandbox.Names     `json:"names"`
	Labels map[string]string `json:"labels"`
}

func newIdentityCommand(a *app) *cobra.Command {
	var flags struct {
		json  bool
		agent string
	}
	cmd := &cobra.Command{
		Use:   "identity [DIR]",
		Short: "Print the checkout's identity: slugs, artifact names and labels",
		Long: `Print how agents-sandbox sees the checkout containing DIR (default: the current
directory): the project directory, the checkout slug (keys the VM, home volume,
state and image), the repo slug (keys the per-repo config), every artifact name
and the labels. A directory outside any git checkout is its own project, keyed
by its resolved path.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := ""
			if len(args) == 1 {
				dir = args[0]
			}
			ov := map[string]string{}
			if flags.agent != "" {
				ov["agent"] = flags.agent
			}
			p, err := a.resolveProject(dir, ov)
			if err != nil {
				return err
			}
			out := identityOutput{Identity: p.ID, Agent: p.Agent, Names: p.Names, Labels: p.ID.Labels(p.Agent, sandbox.KindVM)}
			if flags.json {
				enc := json.NewEncoder(a.streams.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			tw := tabwriter.NewWriter(a.streams.Out, 0, 4, 2, ' ', 0)
			row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
			row("project dir", p.ID.ProjectDir)
			row("git", fmt.Sprint(p.ID.Git))
			if p.ID.GitCommonDir != "" {
				row("git common dir", p.ID.GitCommonDir)
			}
			if p.ID.Origin != "" {
				row("origin", p.ID.Origin)
			}
			row("checkout slug", p.ID.CheckoutSlug)
			row("repo slug", p.ID.RepoSlug)
			row("agent", p.Agent)
			row("vm", p.Names.VM)
			row("task prefix", p.Names.TaskPrefix)
			row("home volume prefix", p.Names.HomeVolumePrefix)
			row("runner image", p.Names.RunnerImage)
			row("runtime image ref", p.Names.RuntimeImageRef)
			row("state dir", p.Names.StateDir)
			row("repo config dir", p.Names.RepoConfigDir)
			keys := make([]string, 0, len(out.Labels))
			for k := range out.Labels {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				row("label", k+"="+out.Labels[k])
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&flags.json, "json", false, "print JSON")
	cmd.Flags().StringVar(&flags.agent, "agent", "", "agent whose artifact names to print (default: the configured agent)")
	return cmd
}
