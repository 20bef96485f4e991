package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/agents-sandbox/agents-sandbox/mcp"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/schemas"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// toolOptions wires the tools for the mcp and serve commands: a Manager
// whose runtime connects on first use (so the server starts, and answers
// "runtime unavailable" per call, when the engine is down).
func (a *app) toolOptions() (mcp.Options, error) {
	m, err := sandbox.NewManager(nil, a.dirs, a.log)
	if err != nil {
		return mcp.Options{}, err
	}
	m.Environ = a.environ
	if bin := a.getenv("AGENTS_SANDBOX_BIN"); bin != "" {
		m.InitBinary = bin
	}
	core := &tools.LazyManager{M: m, Connect: func(ctx context.Context) (sandbox.Runtime, error) { return a.runtime(ctx) }}
	return mcp.Options{
		Registry: tools.All(tools.Deps{Core: core, Log: a.log}),
		Schema:   schemas.Get,
		Log:      a.log,
		Version:  buildVersion(),
	}, nil
}

// protocolOut returns the writer the protocol owns. When out is the
// process's standard output, file descriptor 1 is duplicated for the
// protocol (close-on-exec) and then pointed at standard error, so that
// nothing else — a stray print, a library, a child process inheriting fd 1
// — can ever write to the protocol stream.
func (a *app) protocolOut() (io.Writer, error) {
	f, ok := a.streams.Out.(*os.File)
	if !ok || f.Fd() != 1 {
		return a.streams.Out, nil
	}
	fd, err := unix.Dup(1)
	if err != nil {
		return nil, fmt.Errorf("reserve stdout for the protocol: %w", err)
	}
	unix.CloseOnExec(fd)
	if err := unix.Dup2(2, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("point fd 1 at stderr: %w", err)
	}
	return os.NewFile(uintptr(fd), "protocol-stdout"), nil
}

func newServeCommand(a *app) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "serve [--listen unix:PATH]",
		Short: "Serve the tools as plain JSON-RPC 2.0 on stdin/stdout or a unix socket",
		Long: `Serve the agents-sandbox tools as plain JSON-RPC 2.0, one JSON object per line.
The method is the tool's name (sandbox_create, sandbox_exec, ...), params its input
object and the result its output object; "tools/list" lists the tools with their
schemas; "$/cancelRequest" {"id": ID} cancels a call; the server sends "$/progress"
{"id": ID, "progress": N, "message": TEXT} while a call runs. See docs/mcp.md.

Without --listen it serves one connection on stdin/stdout and exits when stdin
closes. With --listen unix:PATH it serves any number of connections on a unix
socket created with mode 0600 (a stale socket file is replaced; a live one is an
error) until SIGTERM or SIGINT. Sandboxes keep running after the server exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := ""
			if listen != "" && listen != "stdio" {
				p, ok := strings.CutPrefix(listen, "unix:")
				if !ok || p == "" {
					return fmt.Errorf("--listen %q: %w: use unix:PATH (or omit it to serve on stdin/stdout)", listen, sandbox.ErrInvalid)
				}
				path = p
			}
			out, err := a.protocolOut()
			if err != nil {
				return err
			}
			opts, err := a.toolOptions()
			if err != nil {
				return err
			}
			srv, err := mcp.NewRPCServer(opts)
			if err != nil {
				return err
			}
			if path != "" {
				return srv.ListenUnix(cmd.Context(), path, nil)
			}
			a.log.Debug().Msg("serving JSON-RPC on stdin/stdout")
			return srv.ServeStdio(cmd.Context(), a.streams.In, out)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "where to serve: unix:PATH for a unix socket; default stdin/stdout")
	return cmd
}
