package main

import (
	"fmt"
	"net"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/proxy"
)

func newProxyCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "The secret proxy: audit events (and, inside the proxy container, serve)",
	}
	cmd.AddCommand(newProxyAuditCommand(a), newProxyServeCommand(a), newProxyPingCommand(a))
	return cmd
}

func newProxyAuditCommand(a *app) *cobra.Command {
	var f projectFlags
	var n int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the proxy's recent audit events (blocked and substituted requests; never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.inspect = true
			m, p, err := a.open(cmd.Context(), f)
			if err != nil {
				return err
			}
			events, err := m.AuditEvents(cmd.Context(), p, n)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.streams.Out, map[string]any{"items": events})
			}
			tw := tabwriter.NewWriter(a.streams.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tACTION\tSECRET\tHOST\tMETHOD\tPATH\tREASON")
			for _, e := range events {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), e.Action, e.Secret, e.Host, e.Method, e.Path, e.Reason)
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().IntVarP(&n, "number", "n", 50, "how many events")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newProxyServeCommand(a *app) *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:    "serve --config FILE",
		Short:  "Run the proxy (inside its container)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := proxy.ReadConfigFile(config)
			if err != nil {
				return err
			}
			return proxy.Run(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "proxy config file (JSON, as written by agents-sandbox)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func newProxyPingCommand(a *app) *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:    "ping --addr HOST:PORT",
		Short:  "Exit 0 when the proxy accepts connections",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return err
			}
			return c.Close()
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:3128", "address to dial")
	return cmd
}
