package tests

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// strictCompile compiles a schema as draft 2020-12 with format assertions,
// validating it against the metaschema, and refuses references to other
// documents.
func strictCompile(t *testing.T, name string, schema any) *jsonschema.Schema {
	t.Helper()
	b, err := json.Marshal(schema)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(noRefs{t})
	if err := c.AddResource("mem:///"+name, doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	s, err := c.Compile("mem:///" + name)
	if err != nil {
		t.Fatalf("%s does not compile: %v", name, err)
	}
	return s
}

type noRefs struct{ t *testing.T }

func (n noRefs) Load(url string) (any, error) {
	n.t.Errorf("schema refers to %s", url)
	return nil, context.Canceled
}

// TestGoSDKClient drives `agents-sandbox mcp` with the official MCP Go SDK:
// list tools, compile every advertised schema strictly, create a sandbox,
// run a command with progress, cancel a long one and check it is gone.
func TestGoSDKClient(t *testing.T) {
	p := sharedProject(t)
	var mu sync.Mutex
	progress := map[any][]string{}
	client := sdk.NewClient(&sdk.Implementation{Name: "agents-sandbox-go-sdk-test", Version: "0"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			progress[req.Params.ProgressToken] = append(progress[req.Params.ProgressToken], req.Params.Message)
		},
	})
	cmd := exec.Command(binary, "mcp", "--log-level", "debug")
	cmd.Env = p.env
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server stderr:\n%s", tail(stderr.String(), 8000))
		}
	})
	ctx := context.Background()
	cs, err := client.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(lt.Tools) != 10 {
		t.Fatalf("%d tools", len(lt.Tools))
	}
	outSchemas := map[string]*jsonschema.Schema{}
	for _, tool := range lt.Tools {
		strictCompile(t, tool.Name+".input.json", tool.InputSchema)
		outSchemas[tool.Name] = strictCompile(t, tool.Name+".output.json", tool.OutputSchema)
		a := tool.Annotations
		if a == nil || a.DestructiveHint == nil || a.OpenWorldHint == nil || tool.Description == "" {
			t.Errorf("%s: annotations %+v", tool.Name, a)
		}
	}
	call := func(name, token string, args map[string]any) *sdk.CallToolResult {
		t.Helper()
		args["checkout"] = p.dir
		params := &sdk.CallToolParams{Name: name, Arguments: args}
		if token != "" {
			params.SetProgressToken(token)
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		res, err := cs.CallTool(cctx, params)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.IsError {
			t.Fatalf("%s: isError: %v", name, res.Content)
		}
		// The structured content validates against the advertised schema.
		b, _ := json.Marshal(res.StructuredContent)
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		if err := outSchemas[name].Validate(inst); err != nil {
			t.Errorf("%s: structured content does not match its schema: %v", name, err)
		}
		return res
	}
	decodeOut := func(res *sdk.CallToolResult, out any) {
		t.Helper()
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}

	var cr tools.CreateOutput
	decodeOut(call("sandbox_create", "create", map[string]any{"trust": true}), &cr)
	if cr.VM == "" || cr.Project.Agent != "shell" {
		t.Fatalf("create: %+v", cr)
	}
	var er tools.ExecOutput
	decodeOut(call("sandbox_exec", "exec", map[string]any{"cmd": []string{"bash", "-c", "for i in 1 2 3; do echo go-line$i; done"}}), &er)
	if er.ExitCode != 0 || er.Stdout.Text != "go-line1\ngo-line2\ngo-line3\n" {
		t.Fatalf("exec: %+v", er)
	}
	waitFor(t, time.Minute, "exec progress", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(progress["exec"], "\n"), "stdout: go-line3")
	})

	// Cancel a long command: the SDK sends notifications/cancelled.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &sdk.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"checkout": p.dir, "cmd": []string{"sleep", "304"}}})
		done <- err
	}()
	waitFor(t, time.Minute, "the long command to start", func() bool { return p.processesIn(t, "[s]leep 304") > 0 })
	cancel()
	if err := <-done; err == nil {
		t.Error("the cancelled call returned no error")
	}
	waitFor(t, 30*time.Second, "the cancelled command to be gone from the VM", func() bool { return p.processesIn(t, "[s]leep 304") == 0 })

	// The session still serves.
	var st tools.StatusOutput
	decodeOut(call("sandbox_status", "", map[string]any{}), &st)
	if st.State != "running" {
		t.Errorf("status: %+v", st)
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
