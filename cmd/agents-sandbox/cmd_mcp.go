package main

import (
	"github.com/spf13/cobra"

	"github.com/agents-sandbox/agents-sandbox/mcp"
)

func newMCPCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve the tools over MCP on stdin/stdout (Claude Desktop, Claude Code, VS Code, Cursor, Zed)",
		Long: `Serve the agents-sandbox tools to an MCP client over stdio: sandbox_create,
sandbox_exec, sandbox_spawn_task, sandbox_attach, sandbox_provision, secret_proxy,
sandbox_status, sandbox_list, sandbox_stop and sandbox_remove. Each takes the
absolute path of the checkout. Stdout carries only MCP messages; logs go to stderr
(--log-level). The server exits when stdin closes or on SIGTERM; sandboxes keep
running. See docs/mcp.md for the client configuration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := a.protocolOut()
			if err != nil {
				return err
			}
			opts, err := a.toolOptions()
			if err != nil {
				return err
			}
			a.log.Debug().Msg("serving MCP on stdin/stdout")
			return mcp.ServeMCP(cmd.Context(), opts, a.streams.In, out)
		},
	}
}
