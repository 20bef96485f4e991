package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/mcp"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

type errData struct {
	Kind     string          `json:"kind"`
	Tool     string          `json:"tool"`
	Pointer  *string         `json:"pointer"`
	Problems []tools.Problem `json:"problems"`
}

// TestRPCErrors drives the JSON-RPC front end with every kind of bad input
// and checks the code, the data and that the connection keeps serving.
func TestRPCErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	untrusted := filepath.Join(dir, "untrusted")
	if err := os.MkdirAll(filepath.Join(untrusted, ".agents-sandbox"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(untrusted, ".agents-sandbox", "config.toml"), []byte("[network]\nmode = \"open\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		line    string
		code    int
		kind    string
		pointer string // "-": no pointer expected
		msg     string // a substring of the message
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":1,"method":`, -32700, "parse_error", "-", "not valid JSON"},
		{"garbage", `hello`, -32700, "parse_error", "-", "not valid JSON"},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, -32600, "invalid_request", "-", "batch"},
		{"not an object", `42`, -32600, "invalid_request", "-", "object"},
		{"no method", `{"jsonrpc":"2.0","id":1}`, -32600, "invalid_request", "-", "invalid request"},
		{"wrong version", `{"jsonrpc":"1.0","id":1,"method":"tools/list"}`, -32600, "invalid_request", "-", "2.0"},
		{"unknown method", `{"jsonrpc":"2.0","id":1,"method":"sandbox_fly","params":{}}`, -32601, "method_not_found", "-", "sandbox_fly"},
		{"missing checkout", `{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{}}`, -32602, "invalid_params", "", "checkout"},
		{"relative checkout", `{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":"src/app"}}`, -32602, "invalid_params", "/checkout", "checkout"},
		{"wrong type", `{"jsonrpc":"2.0","id":1,"method":"sandbox_exec","params":{"checkout":"/tmp","cmd":"ls -la"}}`, -32602, "invalid_params", "/cmd", "/cmd"},
		{"empty command", `{"jsonrpc":"2.0","id":1,"method":"sandbox_exec","params":{"checkout":"/tmp","cmd":[]}}`, -32602, "invalid_params", "/cmd", "/cmd"},
		{"bad env", `{"jsonrpc":"2.0","id":1,"method":"sandbox_exec","params":{"checkout":"/tmp","cmd":["true"],"env":["NOEQUALS"]}}`, -32602, "invalid_params", "/env/0", "/env/0"},
		{"unknown argument", `{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":"/tmp","verbose":true}}`, -32602, "invalid_params", "", "verbose"},
		{"bad enum", `{"jsonrpc":"2.0","id":1,"method":"sandbox_list","params":{"kind":"image"}}`, -32602, "invalid_params", "/kind", "/kind"},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":["/tmp"]}`, -32602, "invalid_params", "", "object"},
		{"secret set without hosts", `{"jsonrpc":"2.0","id":1,"method":"secret_proxy","params":{"checkout":"/tmp","action":"set","name":"T","from":"env:T"}}`, -32602, "invalid_params", "/hosts", "hosts"},
		{"secret from a command", `{"jsonrpc":"2.0","id":1,"method":"secret_proxy","params":{"checkout":"/tmp","action":"set","name":"T","from":"command:cat /etc/passwd","hosts":["x.example"]}}`, -32602, "invalid_params", "/from", "/from"},
		{"remove unknown secret", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"secret_proxy","params":{"checkout":%q,"action":"remove","name":"NOPE"}}`, dir), -32001, "not_found", "-", "NOPE"},
		{"checkout missing", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":%q}}`, filepath.Join(dir, "nope")), -32001, "not_found", "-", "does not exist"},
		{"checkout is a file", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":%q}}`, file), -32602, "invalid_params", "/checkout", "not a directory"},
		{"unknown agent", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":%q,"agent":"nosuchagent"}}`, dir), -32602, "invalid_params", "/agent", "unknown agent"},
		{"untrusted config", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"sandbox_create","params":{"checkout":%q}}`, untrusted), -32007, "untrusted", "-", "trust: true"},
		{"engine unreachable", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":%q}}`, dir), -32002, "runtime_unavailable", "-", "start the Docker engine"},
		{"engine unreachable (create)", fmt.Sprintf(`{"jsonrpc":"2.0","id":"c","method":"sandbox_create","params":{"checkout":%q}}`, dir), -32002, "runtime_unavailable", "-", "Docker"},
	}
	c := pipeRPC(t, deadEngineOptions(t))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.t = t
			c.send(tt.line)
			m := c.next()
			if m.Error == nil {
				t.Fatalf("no error; result %s", m.Result)
			}
			if m.Error.Code != tt.code {
				t.Errorf("code %d, want %d (%s)", m.Error.Code, tt.code, m.Error.Message)
			}
			if !strings.Contains(m.Error.Message, tt.msg) {
				t.Errorf("message %q does not mention %q", m.Error.Message, tt.msg)
			}
			var d errData
			if err := json.Unmarshal(m.Error.Data, &d); err != nil {
				t.Fatalf("data %s: %v", m.Error.Data, err)
			}
			if d.Kind != tt.kind {
				t.Errorf("data.kind %q, want %q", d.Kind, tt.kind)
			}
			switch {
			case tt.pointer == "-" && d.Pointer != nil:
				t.Errorf("unexpected data.pointer %q", *d.Pointer)
			case tt.pointer != "-" && d.Pointer == nil:
				t.Errorf("no data.pointer, want %q (data %s)", tt.pointer, m.Error.Data)
			case tt.pointer != "-" && *d.Pointer != tt.pointer:
				t.Errorf("data.pointer %q, want %q", *d.Pointer, tt.pointer)
			}
		})
	}
	// After all that, the connection still serves.
	c.t = t
	c.send(`{"jsonrpc":"2.0","id":99,"method":"tools/list"}`)
	if m := c.next(); m.Error != nil || !bytes.Contains(m.Result, []byte("sandbox_exec")) {
		t.Fatalf("tools/list after bad input: %+v", m)
	}
}

// TestRPCOversizedMessage sends a line just over 16 MiB: it is rejected,
// and the next request is served.
func TestRPCOversizedMessage(t *testing.T) {
	c := pipeRPC(t, deadEngineOptions(t))
	big := `{"jsonrpc":"2.0","id":1,"method":"sandbox_status","params":{"checkout":"/` + strings.Repeat("a", mcp.MaxMessageBytes) + `"}}`
	go func() { _, _ = c.c.Write([]byte(big + "\n")) }()
	m := c.next()
	if m.Error == nil || m.Error.Code != -32600 || !strings.Contains(m.Error.Message, "larger than") {
		t.Fatalf("oversized message: %+v", m.Error)
	}
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if m := c.next(); m.Error != nil || string(m.ID) != "2" {
		t.Fatalf("after oversized message: %+v", m)
	}
}

// TestRPCLineReaderMemory reads a 64 MiB line through the framing layer
// and checks the server neither answers with it nor buffers it.
func TestRPCLineReaderMemory(t *testing.T) {
	c := pipeRPC(t, deadEngineOptions(t))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	go func() {
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for i := 0; i < 64; i++ {
			if _, err := c.c.Write(chunk); err != nil {
				return
			}
		}
		_, _ = c.c.Write([]byte("\n"))
	}()
	m := c.next()
	runtime.ReadMemStats(&after)
	if m.Error == nil || m.Error.Code != -32600 {
		t.Fatalf("64 MiB line: %+v", m)
	}
	// The line is read in 64 KiB pieces; what the server allocated while
	// skipping it must stay far below its size (the test's own 1 MiB chunk
	// and the limit-sized buffer of the first 16 MiB are the bulk).
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 48<<20 {
		t.Errorf("allocated %d MiB while skipping a 64 MiB line", grown>>20)
	}
}

// TestRPCToolsList checks tools/list serves every tool with the schema files
// byte for byte (compacted) and explicit annotations.
func TestRPCToolsList(t *testing.T) {
	c := pipeRPC(t, deadEngineOptions(t))
	c.send(`{"jsonrpc":"2.0","id":"l","method":"tools/list","params":null}`)
	m := c.next()
	if m.Error != nil {
		t.Fatal(m.Error.Message)
	}
	var res struct {
		Tools []struct {
			Name         string          `json:"name"`
			Description  string          `json:"description"`
			InputSchema  json.RawMessage `json:"inputSchema"`
			OutputSchema json.RawMessage `json:"outputSchema"`
			Annotations  map[string]any  `json:"annotations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(m.Result, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 10 {
		t.Fatalf("%d tools, want 10", len(res.Tools))
	}
	for _, tool := range res.Tools {
		for _, s := range []struct {
			file string
			got  json.RawMessage
		}{{tool.Name + ".input.json", tool.InputSchema}, {tool.Name + ".output.json", tool.OutputSchema}} {
			raw, err := schemaFromDisk(s.file)
			if err != nil {
				t.Fatal(err)
			}
			var want, got any
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(s.got, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(want, got) {
				t.Errorf("%s: served schema differs from the file", s.file)
			}
		}
		for _, h := range []string{"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"} {
			if _, ok := tool.Annotations[h].(bool); !ok {
				t.Errorf("%s: annotation %s missing", tool.Name, h)
			}
		}
	}
}

// TestRPCCancelUnknownAndNotifications: a cancel for no call and a tool
// call sent as a notification get no answer; the next request does.
func TestRPCCancelUnknownAndNotifications(t *testing.T) {
	c := pipeRPC(t, deadEngineOptions(t))
	c.send(`{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":12345}}`)
	c.send(`{"jsonrpc":"2.0","method":"sandbox_list","params":{}}`)
	c.send(`{"jsonrpc":"2.0","id":7,"method":"$/cancelRequest","params":{"id":"nope"}}`)
	m := c.next()
	if string(m.ID) != "7" || m.Error != nil || !bytes.Contains(m.Result, []byte(`"cancelled":false`)) {
		t.Fatalf("cancel request: %+v %s", m.Error, m.Result)
	}
}

// TestRPCStdio serves over a reader and writer (the stdio mode) and ends
// cleanly when the input closes.
func TestRPCStdio(t *testing.T) {
	srv, err := mcp.NewRPCServer(deadEngineOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	in := strings.NewReader("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\nnot json\n")
	var out bytes.Buffer
	if err := srv.ServeStdio(context.Background(), in, &out); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	var codes []string
	for sc.Scan() {
		var m message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("output line not JSON: %q", sc.Text())
		}
		if m.Error != nil {
			codes = append(codes, fmt.Sprint(m.Error.Code))
		} else {
			codes = append(codes, "ok")
		}
	}
	if strings.Join(codes, ",") != "ok,-32700" && strings.Join(codes, ",") != "-32700,ok" {
		t.Errorf("answers %v, want a result and a -32700", codes)
	}
}

// TestListenUnix: mode 0600, a stale socket is replaced, a live one is an
// error, and the socket goes away on shutdown.
func TestListenUnix(t *testing.T) {
	o := deadEngineOptions(t)
	srv, err := mcp.NewRPCServer(o)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "as-sock-") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "rpc.sock")

	// A stale socket: bound, then its listener closed without unlinking.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- srv.ListenUnix(ctx, path, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("ListenUnix: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket mode %v, want a socket with 0600", fi.Mode())
	}
	// A second server on the live socket is refused.
	if err := srv.ListenUnix(context.Background(), path, nil); err == nil || !strings.Contains(err.Error(), "already listening") {
		t.Errorf("second server on a live socket: %v", err)
	}
	// The socket serves.
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(conn, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(line, "sandbox_exec") {
		t.Fatalf("answer %q, %v", line, err)
	}
	conn.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ListenUnix after cancel: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	// A regular file in the way is not replaced.
	if err := os.WriteFile(path, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.ListenUnix(context.Background(), path, nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file in the way: %v", err)
	}
	_ = io.EOF
}
