package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
)

func newConfigCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Inspect the layered configuration",
	}
	cmd.AddCommand(newConfigShowCommand(a))
	return cmd
}

type configShowOutput struct {
	Config  any               `json:"config"`
	Origins map[string]string `json:"origins"`
	Files   []string          `json:"files"`
}

func newConfigShowCommand(a *app) *cobra.Command {
	var flags struct {
		json bool
		dir  string
	}
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Print the merged configuration and which layer set each key",
		Long: `Print the merged configuration of the checkout in the current directory (or
--dir) and, for each key, the layer that set it. Layers, lowest first:
default < user ($XDG_CONFIG_HOME/agents-sandbox/config.toml) < repo
($XDG_CONFIG_HOME/agents-sandbox/<repo-slug>/config.toml) < project
(.agents-sandbox/config.toml) < env (AGENTS_SANDBOX_*) < flag.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := a.resolveProject(flags.dir, nil)
			if err != nil {
				return err
			}
			if flags.json {
				enc := json.NewEncoder(a.streams.Out)
				enc.SetIndent("", "  ")
				files := p.Config.Files
				if files == nil {
					files = []string{}
				}
				return enc.Encode(configShowOutput{Config: p.Config.Config, Origins: p.Config.Origins, Files: files})
			}
			var buf bytes.Buffer
			if err := toml.NewEncoder(&buf).Encode(p.Config.Config); err != nil {
				return fmt.Errorf("encode config: %w", err)
			}
			fmt.Fprintf(a.streams.Out, "# files read: %s\n", strings.Join(p.Config.Files, ", "))
			a.streams.Out.Write(buf.Bytes())
			fmt.Fprintln(a.streams.Out, "\n# origins (key = layer)")
			keys := make([]string, 0, len(p.Config.Origins))
			for k := range p.Config.Origins {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(a.streams.Out, "# %s = %s\n", k, p.Config.Origins[k])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&flags.json, "json", false, "print JSON")
	cmd.Flags().StringVar(&flags.dir, "dir", "", "checkout directory (default: current directory)")
	return cmd
}
