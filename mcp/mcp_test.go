package mcp_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/agents-sandbox/agents-sandbox/mcp"
)

// inProcessClient starts an in-process MCP client on a server for o.
func inProcessClient(t *testing.T, o mcp.Options) *client.Client {
	t.Helper()
	s, err := mcp.NewMCPServer(o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewInProcessClient(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcpgo.InitializeRequest{}
	init.Params.ClientInfo = mcpgo.Implementation{Name: "test", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return c
}

func callTool(t *testing.T, c *client.Client, name string, args map[string]any) *mcpgo.CallToolResult {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	res, err := c.CallTool(context.Background(), req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func resultText(r *mcpgo.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcpgo.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

func TestMCPListTools(t *testing.T) {
	c := inProcessClient(t, deadEngineOptions(t))
	res, err := c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 10 {
		t.Fatalf("%d tools", len(res.Tools))
	}
	for _, tool := range res.Tools {
		a := tool.Annotations
		if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil || a.OpenWorldHint == nil {
			t.Errorf("%s: hints not all set: %+v", tool.Name, a)
		}
		if tool.Description == "" || len(tool.RawInputSchema) == 0 && tool.InputSchema.Type == "" {
			t.Errorf("%s: no description or input schema", tool.Name)
		}
	}
}

// TestMCPErrors: failures the caller can act on are isError results whose
// text names the fix.
func TestMCPErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		tool string
		args map[string]any
		want string
	}{
		{"missing checkout", "sandbox_status", map[string]any{}, "checkout"},
		{"relative checkout", "sandbox_exec", map[string]any{"checkout": "rel", "cmd": []string{"true"}}, "/checkout"},
		{"wrong type", "sandbox_exec", map[string]any{"checkout": dir, "cmd": "ls"}, "/cmd"},
		{"unknown argument", "sandbox_remove", map[string]any{"checkout": dir, "force": true}, "force"},
		{"checkout missing", "sandbox_create", map[string]any{"checkout": filepath.Join(dir, "gone")}, "does not exist"},
		{"unknown agent", "sandbox_create", map[string]any{"checkout": dir, "agent": "nosuch"}, "unknown agent"},
		{"engine unreachable", "sandbox_create", map[string]any{"checkout": dir}, "start the Docker engine"},
		{"engine unreachable (list)", "sandbox_list", map[string]any{}, "start the Docker engine"},
	}
	c := inProcessClient(t, deadEngineOptions(t))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := callTool(t, c, tt.tool, tt.args)
			if !res.IsError {
				t.Fatalf("not an error: %s", resultText(res))
			}
			if txt := resultText(res); !strings.Contains(txt, tt.want) {
				t.Errorf("text %q does not mention %q", txt, tt.want)
			}
		})
	}
}
