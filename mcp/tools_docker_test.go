package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/sourcegraph/jsonrpc2"

	"github.com/agents-sandbox/agents-sandbox/mcp"
	"github.com/agents-sandbox/agents-sandbox/schemas"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// rpcClient is a sourcegraph/jsonrpc2 client over a net.Pipe to the
// JSON-RPC front end; it records $/progress notifications by request id.
type rpcClient struct {
	conn *jsonrpc2.Conn

	mu       sync.Mutex
	progress map[string][]string
}

func newRPCClient(t *testing.T, o mcp.Options) *rpcClient {
	t.Helper()
	srv, err := mcp.NewRPCServer(o)
	if err != nil {
		t.Fatal(err)
	}
	a, b := pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeConn(ctx, a)
	}()
	c := &rpcClient{progress: map[string][]string{}}
	c.conn = jsonrpc2.NewConn(ctx, jsonrpc2.NewPlainObjectStream(b), jsonrpc2.HandlerWithError(func(_ context.Context, _ *jsonrpc2.Conn, req *jsonrpc2.Request) (any, error) {
		if req.Method == mcp.MethodProgress && req.Params != nil {
			var p struct {
				ID       jsonrpc2.ID `json:"id"`
				Progress float64     `json:"progress"`
				Message  string      `json:"message"`
			}
			if err := json.Unmarshal(*req.Params, &p); err == nil {
				c.mu.Lock()
				c.progress[p.ID.String()] = append(c.progress[p.ID.String()], p.Message)
				c.mu.Unlock()
			}
		}
		return nil, nil
	}))
	t.Cleanup(func() {
		c.conn.Close()
		cancel()
		<-done
	})
	return c
}

func (c *rpcClient) progressOf(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.progress[id], "\n")
}

// call calls method with params and decodes the result into out.
func (c *rpcClient) call(ctx context.Context, id string, method string, params, out any) error {
	return c.conn.Call(ctx, method, params, out, jsonrpc2.PickID(jsonrpc2.ID{Str: id, IsString: true}))
}

// frontEnd calls a tool through one front end and decodes its output.
type frontEnd struct {
	name string
	// try calls tool; it is safe from any goroutine.
	try func(tool string, args map[string]any, out any) error
}

// call is try that fails the test on error (from the test's goroutine).
func (fe frontEnd) call(t *testing.T, tool string, args map[string]any, out any) {
	t.Helper()
	if err := fe.try(tool, args, out); err != nil {
		t.Fatal(err)
	}
}

// checkOutput validates a tool's output (as JSON) against its output schema.
func checkOutput(tool string, out []byte) error {
	raw, err := schemas.Get(tool + ".output.json")
	if err != nil {
		return err
	}
	s, err := mcp.CompileSchema(tool+".output.json", raw)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
	if err != nil {
		return err
	}
	if err := s.Validate(inst); err != nil {
		return fmt.Errorf("%s: output does not match its schema: %w\n%s", tool, err, out)
	}
	return nil
}

func frontEnds(t *testing.T, o mcp.Options) []frontEnd {
	mc := inProcessClient(t, o)
	rc := newRPCClient(t, o)
	var n atomic.Int64
	return []frontEnd{
		{"mcp", func(tool string, args map[string]any, out any) error {
			req := mcpgo.CallToolRequest{}
			req.Params.Name = tool
			req.Params.Arguments = args
			res, err := mc.CallTool(context.Background(), req)
			if err != nil {
				return fmt.Errorf("%s: %w", tool, err)
			}
			if res.IsError {
				return fmt.Errorf("%s: isError: %s", tool, resultText(res))
			}
			if len(res.Content) == 0 || resultText(res) == "" {
				return fmt.Errorf("%s: no text content", tool)
			}
			b, err := json.Marshal(res.StructuredContent)
			if err != nil {
				return err
			}
			if err := checkOutput(tool, b); err != nil {
				return err
			}
			return json.Unmarshal(b, out)
		}},
		{"jsonrpc", func(tool string, args map[string]any, out any) error {
			var raw json.RawMessage
			if err := rc.call(context.Background(), fmt.Sprintf("r%d", n.Add(1)), tool, args, &raw); err != nil {
				return fmt.Errorf("%s: %w", tool, err)
			}
			if err := checkOutput(tool, raw); err != nil {
				return err
			}
			return json.Unmarshal(raw, out)
		}},
	}
}

// TestToolsDocker calls every tool through both front ends against a real
// sandbox: create, exec, status, list, provision, attach, spawn a task,
// secret_proxy, stop and remove.
func TestToolsDocker(t *testing.T) {
	p := dockerProject(t)
	fes := frontEnds(t, p.opts)
	ck := map[string]any{"checkout": p.dir}
	with := func(extra map[string]any) map[string]any {
		m := map[string]any{"checkout": p.dir}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	for _, fe := range fes {
		t.Run(fe.name, func(t *testing.T) {
			var cr tools.CreateOutput
			fe.call(t, "sandbox_create", ck, &cr)
			if cr.Project.Agent != "shell" || cr.VM == "" || cr.HomeVolume == "" || cr.ImageID == "" {
				t.Errorf("create: %+v", cr)
			}

			var er tools.ExecOutput
			fe.call(t, "sandbox_exec", with(map[string]any{"cmd": []string{"bash", "-c", "echo out; echo err >&2; pwd; exit 3"}, "env": []string{"A=1"}}), &er)
			if er.ExitCode != 3 || er.Stdout.Text != "out\n/workspace\n" || er.Stderr.Text != "err\n" {
				t.Errorf("exec: %+v", er)
			}
			fe.call(t, "sandbox_exec", with(map[string]any{"cmd": []string{"cat"}, "stdin": "in put", "user": "root"}), &er)
			if er.ExitCode != 0 || er.Stdout.Text != "in put" {
				t.Errorf("exec with stdin: %+v", er)
			}
			fe.call(t, "sandbox_exec", with(map[string]any{"cmd": []string{"sleep", "30"}, "timeout_seconds": 1}), &er)
			if !er.TimedOut || er.ExitCode != 124 {
				t.Errorf("exec with timeout: %+v", er)
			}

			var st tools.StatusOutput
			fe.call(t, "sandbox_status", ck, &st)
			if st.State != "running" || st.VM != cr.VM {
				t.Errorf("status: %+v", st)
			}

			var ls tools.ListOutput
			fe.call(t, "sandbox_list", ck, &ls)
			if len(ls.Items) != 1 || ls.Items[0].Name != cr.VM || ls.Items[0].Kind != "vm" {
				t.Errorf("list: %+v", ls)
			}

			var pr tools.ProvisionOutput
			fe.call(t, "sandbox_provision", ck, &pr)
			if pr.VM != cr.VM {
				t.Errorf("provision: %+v", pr)
			}

			var ar tools.ExecOutput
			fe.call(t, "sandbox_attach", with(map[string]any{"headless": true, "args": []string{"echo attached-$((6*7))"}}), &ar)
			if ar.ExitCode != 0 || ar.Stdout.Text != "attached-42\n" {
				t.Errorf("attach: %+v", ar)
			}

			var tr tools.SpawnTaskOutput
			fe.call(t, "sandbox_spawn_task", with(map[string]any{"cmd": []string{"bash", "-c", "echo new > made-by-task.txt"}, "timeout_seconds": 120}), &tr)
			if tr.ExitCode != 0 || len(tr.Changed) != 1 || tr.Changed[0] != "made-by-task.txt" || !strings.Contains(tr.Diff, "+new") {
				t.Errorf("task: %+v", tr)
			}

			var sp tools.SecretProxyOutput
			fe.call(t, "secret_proxy", with(map[string]any{"action": "status"}), &sp)
			if sp.Network.Mode != "open" || sp.VMState != "running" || len(sp.Secrets) != 0 {
				t.Errorf("secret_proxy status: %+v", sp)
			}
			fe.call(t, "secret_proxy", with(map[string]any{"action": "audit", "limit": 5}), &sp)
			if len(sp.Audit) != 0 {
				t.Errorf("secret_proxy audit: %+v", sp)
			}
			tokenFile := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tokenFile, []byte("s3cret-value-never-shown"), 0o600); err != nil {
				t.Fatal(err)
			}
			fe.call(t, "secret_proxy", with(map[string]any{"action": "set", "name": "API_TOKEN", "from": "file:" + tokenFile, "hosts": []string{"api.example.com"}}), &sp)
			if !sp.Changed || len(sp.Secrets) != 1 || sp.Secrets[0].Name != "API_TOKEN" || sp.Secrets[0].Layer != "state" || sp.Secrets[0].From != "file:"+tokenFile {
				t.Errorf("secret_proxy set: %+v", sp)
			}
			fe.call(t, "secret_proxy", with(map[string]any{"action": "list"}), &sp)
			if b, _ := json.Marshal(sp); len(sp.Secrets) != 1 || strings.Contains(string(b), "s3cret-value") {
				t.Errorf("secret_proxy list: %s", b)
			}
			fe.call(t, "secret_proxy", with(map[string]any{"action": "remove", "name": "API_TOKEN"}), &sp)
			if !sp.Changed || len(sp.Secrets) != 0 {
				t.Errorf("secret_proxy remove: %+v", sp)
			}

			fe.call(t, "sandbox_stop", with(map[string]any{"timeout_seconds": 2}), &st)
			if st.State != "stopped" {
				t.Errorf("stop: %+v", st)
			}
			// exec starts a stopped VM again.
			fe.call(t, "sandbox_exec", with(map[string]any{"cmd": []string{"true"}}), &er)
			if er.ExitCode != 0 {
				t.Errorf("exec after stop: %+v", er)
			}
		})
	}
	t.Run("remove", func(t *testing.T) {
		var rr tools.RemoveOutput
		fes[1].call(t, "sandbox_remove", ck, &rr)
		if len(rr.Removed) == 0 || !strings.HasPrefix(rr.Removed[0], "vm ") {
			t.Errorf("remove: %+v", rr)
		}
		var st tools.StatusOutput
		fes[0].call(t, "sandbox_status", ck, &st)
		if st.State != "missing" {
			t.Errorf("status after remove: %+v", st)
		}
		// A dry run plans the create and changes nothing.
		var dr tools.CreateOutput
		fes[1].call(t, "sandbox_create", map[string]any{"checkout": p.dir, "dry_run": true}, &dr)
		if !dr.DryRun || dr.Action != "created" || len(dr.Changes) == 0 {
			t.Errorf("dry-run create: %+v", dr)
		}
		fes[0].call(t, "sandbox_status", ck, &st)
		if st.State != "missing" {
			t.Errorf("status after a dry-run create: %+v", st)
		}
		// Re-create for the tests that follow.
		var cr tools.CreateOutput
		fes[0].call(t, "sandbox_create", ck, &cr)
		if cr.Action != "created" || cr.ImageBuilt {
			t.Errorf("create after remove: %+v", cr)
		}
	})
}

// TestProgressDocker: output of a command arrives as progress
// notifications, through MCP (with a progress token) and JSON-RPC.
func TestProgressDocker(t *testing.T) {
	p := dockerProject(t)
	ensureCreated(t, p)
	script := "for i in 1 2 3 4 5; do echo line$i; done; echo oops >&2"

	t.Run("mcp", func(t *testing.T) {
		c := inProcessClient(t, p.opts)
		var mu sync.Mutex
		var msgs []string
		var tokens []any
		c.OnNotification(func(n mcpgo.JSONRPCNotification) {
			if n.Method != "notifications/progress" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			msgs = append(msgs, fmt.Sprint(n.Params.AdditionalFields["message"]))
			tokens = append(tokens, n.Params.AdditionalFields["progressToken"])
		})
		req := mcpgo.CallToolRequest{}
		req.Params.Name = "sandbox_exec"
		req.Params.Arguments = map[string]any{"checkout": p.dir, "cmd": []string{"bash", "-c", script}}
		req.Params.Meta = &mcpgo.Meta{ProgressToken: "tok-1"}
		res, err := c.CallTool(context.Background(), req)
		if err != nil || res.IsError {
			t.Fatalf("exec: %v %s", err, resultText(res))
		}
		// The in-process transport may deliver notifications out of order:
		// wait for every line, not only the last one sent.
		waitFor(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			all := strings.Join(msgs, "\n")
			for _, want := range []string{"stdout: line1", "stdout: line5", "stderr: oops"} {
				if !strings.Contains(all, want) {
					return false
				}
			}
			return true
		})
		mu.Lock()
		defer mu.Unlock()
		all := strings.Join(msgs, "\n")
		for i := 1; i <= 5; i++ {
			if !strings.Contains(all, fmt.Sprintf("stdout: line%d", i)) {
				t.Errorf("progress lacks line%d: %q", i, all)
			}
		}
		for _, tok := range tokens {
			if tok != "tok-1" {
				t.Errorf("progress token %v", tok)
			}
		}
	})
	t.Run("jsonrpc", func(t *testing.T) {
		c := newRPCClient(t, p.opts)
		var out tools.ExecOutput
		if err := c.call(context.Background(), "prog", "sandbox_exec", map[string]any{"checkout": p.dir, "cmd": []string{"bash", "-c", script}}, &out); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return strings.Contains(c.progressOf(`"prog"`), "stderr: oops") })
		if got := c.progressOf(`"prog"`); !strings.Contains(got, "stdout: line1") || !strings.Contains(got, "stdout: line5") {
			t.Errorf("progress: %q", got)
		}
	})
}

// TestCancelDocker cancels a long exec through each front end and checks
// that the command is gone from the VM, and that a slow call does not
// block others on the same connection.
func TestCancelDocker(t *testing.T) {
	p := dockerProject(t)
	ensureCreated(t, p)

	t.Run("mcp", func(t *testing.T) {
		c := inProcessClient(t, p.opts)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			req := mcpgo.CallToolRequest{}
			req.Params.Name = "sandbox_exec"
			req.Params.Arguments = map[string]any{"checkout": p.dir, "cmd": []string{"sleep", "301"}}
			res, err := c.CallTool(ctx, req)
			if err == nil && res.IsError && strings.Contains(resultText(res), "cancelled") {
				// In process, the client's context is the handler's: the
				// handler sees the cancellation and answers isError.
				err = context.Canceled
			}
			done <- err
		}()
		waitFor(t, func() bool { return processesIn(t, p, "[s]leep 301") > 0 })
		// Another call on the same client is served while the exec runs.
		if res := callTool(t, c, "sandbox_status", map[string]any{"checkout": p.dir}); res.IsError {
			t.Fatalf("status during a long exec: %s", resultText(res))
		}
		cancel()
		if err := <-done; err == nil {
			t.Error("cancelled call returned no error")
		}
		waitNoProcess(t, p, "[s]leep 301")
	})
	t.Run("jsonrpc", func(t *testing.T) {
		c := newRPCClient(t, p.opts)
		done := make(chan error, 1)
		go func() {
			var out tools.ExecOutput
			done <- c.call(context.Background(), "long", "sandbox_exec", map[string]any{"checkout": p.dir, "cmd": []string{"sleep", "302"}}, &out)
		}()
		waitFor(t, func() bool { return processesIn(t, p, "[s]leep 302") > 0 })
		var st tools.StatusOutput
		if err := c.call(context.Background(), "st", "sandbox_status", map[string]any{"checkout": p.dir}, &st); err != nil || st.State != "running" {
			t.Fatalf("status during a long exec: %v %+v", err, st)
		}
		if err := c.conn.Notify(context.Background(), mcp.MethodCancel, map[string]any{"id": "long"}); err != nil {
			t.Fatal(err)
		}
		err := <-done
		var je *jsonrpc2.Error
		if !asRPCError(err, &je) || je.Code != int64(tools.CodeCancelled) {
			t.Fatalf("cancelled call: %v", err)
		}
		waitNoProcess(t, p, "[s]leep 302")
	})
}

func asRPCError(err error, out **jsonrpc2.Error) bool {
	je, ok := err.(*jsonrpc2.Error)
	if ok {
		*out = je
	}
	return ok
}

// ensureCreated makes sure the shared project's VM runs.
func ensureCreated(t *testing.T, p *project) {
	t.Helper()
	c := newRPCClient(t, p.opts)
	var cr tools.CreateOutput
	if err := c.call(context.Background(), "create", "sandbox_create", map[string]any{"checkout": p.dir}, &cr); err != nil {
		t.Fatalf("create: %v", err)
	}
}

// waitFor waits (up to 2 minutes) until cond holds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 2 minutes")
		}
		<-tick.C
	}
}

// TestRPCStdioPipeFinishesCalls: a script that pipes one request in and
// closes its end still gets the answer of a call that outlives the input.
func TestRPCStdioPipeFinishesCalls(t *testing.T) {
	p := dockerProject(t)
	ensureCreated(t, p)
	srv, err := mcp.NewRPCServer(p.opts)
	if err != nil {
		t.Fatal(err)
	}
	req := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"sandbox_exec","params":{"checkout":%q,"cmd":["sh","-c","sleep 1; echo finished"]}}`+"\n", p.dir)
	var out bytes.Buffer
	if err := srv.ServeStdio(context.Background(), strings.NewReader(req), &out); err != nil {
		t.Fatal(err)
	}
	var got *tools.ExecOutput
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m struct {
			ID     *int              `json:"id"`
			Result *tools.ExecOutput `json:"result"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("output line not JSON: %q", line)
		}
		if m.ID != nil && *m.ID == 7 {
			got = m.Result
		}
	}
	if got == nil || got.ExitCode != 0 || got.Stdout.Text != "finished\n" {
		t.Errorf("answer to the piped call: %+v\noutput:\n%s", got, out.String())
	}
}
