package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newTrustCommand(a *app) *cobra.Command {
	var f projectFlags
	cmd := &cobra.Command{
		Use:   "trust",
		Short: "Accept the checkout's own secrets, home mappings, mounts and egress settings",
		Long: `The checkout's .agents-sandbox/config.toml lives where the agent can write it. The
settings in it that can carry host data into the VM or widen its egress ([secrets],
[home], [[mounts]], network.allow, network.mode = "open", image.ca_certificates,
oci_runtime) take effect only once you have reviewed and trusted them, and again
after every change to them. This command records your trust for the current
content.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.trust = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			keys, err := m.TrustedSettings(p)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				fmt.Fprintf(a.streams.Out, "%s: the checkout's configuration sets nothing that needs trust\n", p.ID.ProjectDir)
				return nil
			}
			fmt.Fprintf(a.streams.Out, "trusted these settings of %s/.agents-sandbox/config.toml:\n", p.ID.ProjectDir)
			for _, k := range keys {
				fmt.Fprintf(a.streams.Out, "  %s\n", k)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&f.dir, "dir", "C", "", "checkout directory (default: the current directory)")
	cmd.Flags().StringVarP(&f.agent, "agent", "a", "", "agent to use (default: the configured agent)")
	return cmd
}
