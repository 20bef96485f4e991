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
			_, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.streams.Out, "trusted the project configuration of %s\n", p.ID.ProjectDir)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
