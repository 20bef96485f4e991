package tests

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// socketClient is a scripted JSON-RPC client on a unix socket: it writes
// requests as lines and sorts what comes back into responses by id and
// $/progress notifications by the id they carry.
type socketClient struct {
	t    *testing.T
	conn net.Conn

	mu        sync.Mutex
	responses map[string]rpcMessage
	progress  map[string][]string
	bad       []string
	closed    bool
	changed   chan struct{}
}

func dialSocket(t *testing.T, path string) *socketClient {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := &socketClient{t: t, conn: conn, responses: map[string]rpcMessage{}, progress: map[string][]string{}, changed: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(conn)
		sc.Buffer(nil, 32<<20)
		for sc.Scan() {
			var m rpcMessage
			c.mu.Lock()
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m.JSONRPC != "2.0" {
				c.bad = append(c.bad, sc.Text())
			} else if m.Method == "$/progress" {
				var p struct {
					ID      json.RawMessage `json:"id"`
					Message string          `json:"message"`
				}
				_ = json.Unmarshal(m.Params, &p)
				c.progress[string(p.ID)] = append(c.progress[string(p.ID)], p.Message)
			} else {
				c.responses[string(m.ID)] = m
			}
			c.mu.Unlock()
			select {
			case c.changed <- struct{}{}:
			default:
			}
		}
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
	}()
	t.Cleanup(func() { conn.Close() })
	return c
}

func (c *socketClient) send(id any, method string, params any) {
	c.t.Helper()
	m := map[string]any{"jsonrpc": "2.0", "method": method}
	if id != nil {
		m["id"] = id
	}
	if params != nil {
		m["params"] = params
	}
	b, _ := json.Marshal(m)
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
}

// wait returns the response with id (its JSON form, e.g. `"a"` or `3`).
func (c *socketClient) wait(id string, limit time.Duration) rpcMessage {
	c.t.Helper()
	var m rpcMessage
	waitFor(c.t, limit, "the answer to "+id, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var ok bool
		m, ok = c.responses[id]
		if c.closed && !ok {
			c.t.Fatalf("connection closed before the answer to %s", id)
		}
		return ok
	})
	return m
}

func (c *socketClient) result(id string, limit time.Duration, out any) {
	c.t.Helper()
	m := c.wait(id, limit)
	if m.Error != nil {
		c.t.Fatalf("%s: error %d %s", id, m.Error.Code, m.Error.Message)
	}
	if err := json.Unmarshal(m.Result, out); err != nil {
		c.t.Fatal(err)
	}
}

// TestJSONRPCUnixSocket starts `agents-sandbox serve --listen unix:PATH`
// and drives it with a scripted client: tools/list with strict schema
// checks, create, exec with $/progress, a concurrent call while a long exec
// runs, $/cancelRequest (the command is gone from the VM), a malformed line,
// then SIGTERM: the server exits 0, removes its socket, and the sandbox
// keeps running.
func TestJSONRPCUnixSocket(t *testing.T) {
	p := sharedProject(t)
	sockDir, err := os.MkdirTemp("", "as-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "rpc.sock")
	cmd := exec.Command(binary, "serve", "--listen", "unix:"+sock, "--log-level", "debug")
	cmd.Env = p.env
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("server stderr:\n%s", tail(stderr.String(), 8000))
		}
	})
	waitFor(t, 30*time.Second, "the socket", func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}

	c := dialSocket(t, sock)
	c.send("list", "tools/list", nil)
	var list struct {
		Tools []struct {
			Name         string `json:"name"`
			InputSchema  any    `json:"inputSchema"`
			OutputSchema any    `json:"outputSchema"`
		} `json:"tools"`
	}
	c.result(`"list"`, time.Minute, &list)
	if len(list.Tools) != 10 {
		t.Fatalf("%d tools", len(list.Tools))
	}
	for _, tool := range list.Tools {
		strictCompile(t, tool.Name+".input.json", tool.InputSchema)
		strictCompile(t, tool.Name+".output.json", tool.OutputSchema)
	}

	c.send(1, "sandbox_create", map[string]any{"checkout": p.dir, "trust": true})
	var cr tools.CreateOutput
	c.result("1", 10*time.Minute, &cr)

	c.send(2, "sandbox_exec", map[string]any{"checkout": p.dir, "cmd": []string{"bash", "-c", "for i in 1 2 3; do echo rpc-line$i; done"}})
	var er tools.ExecOutput
	c.result("2", time.Minute, &er)
	if er.Stdout.Text != "rpc-line1\nrpc-line2\nrpc-line3\n" {
		t.Errorf("exec: %+v", er)
	}
	waitFor(t, 30*time.Second, "$/progress for request 2", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return strings.Contains(strings.Join(c.progress["2"], "\n"), "stdout: rpc-line3")
	})

	// A long exec; meanwhile other calls (and a malformed line) are served.
	c.send("long", "sandbox_exec", map[string]any{"checkout": p.dir, "cmd": []string{"sleep", "305"}})
	waitFor(t, time.Minute, "the long command to start", func() bool { return p.processesIn(t, "[s]leep 305") > 0 })
	if _, err := c.conn.Write([]byte("{not json\n")); err != nil {
		t.Fatal(err)
	}
	if m := c.wait("null", 30*time.Second); m.Error == nil || m.Error.Code != -32700 {
		t.Errorf("malformed line: %+v", m)
	}
	c.send(3, "sandbox_status", map[string]any{"checkout": p.dir})
	var st tools.StatusOutput
	c.result("3", time.Minute, &st)
	if st.State != "running" {
		t.Errorf("status: %+v", st)
	}
	c.send(nil, "$/cancelRequest", map[string]any{"id": "long"})
	if m := c.wait(`"long"`, time.Minute); m.Error == nil || m.Error.Code != int(tools.CodeCancelled) {
		t.Errorf("cancelled call: %+v", m)
	}
	waitFor(t, 30*time.Second, "the cancelled command to be gone", func() bool { return p.processesIn(t, "[s]leep 305") == 0 })

	// A second client on the same socket is served too.
	c2 := dialSocket(t, sock)
	c2.send(1, "sandbox_list", map[string]any{"checkout": p.dir})
	var ls tools.ListOutput
	c2.result("1", time.Minute, &ls)
	if len(ls.Items) != 1 {
		t.Errorf("list: %+v", ls)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("server after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("server did not exit within a minute of SIGTERM")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	if out := stdout.String(); out != "" {
		t.Errorf("socket mode wrote to stdout: %q", tail(out, 500))
	}
	c.mu.Lock()
	if len(c.bad) > 0 {
		t.Errorf("non-protocol lines on the socket: %q", c.bad)
	}
	c.mu.Unlock()
	// The sandbox keeps running.
	if n := p.processesIn(t, "[v]m-init"); n == 0 {
		t.Error("the VM's init is gone after the server exited")
	}
}
