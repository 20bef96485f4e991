package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
)

// buildingDockerfile is a project Dockerfile whose build really runs a step
// (the nonce defeats the layer cache) that writes to stdout and stderr.
func buildingDockerfile() string {
	return fmt.Sprintf("FROM %s\nRUN echo nonce-%d && for i in 1 2 3; do echo build-output-$i; echo build-stderr-$i >&2; done\n",
		testenv.BaseImageRef, time.Now().UnixNano())
}

// checkProtocolOnly fails unless every byte the server wrote to stdout is a
// newline-terminated JSON-RPC 2.0 message.
func checkProtocolOnly(t *testing.T, stdout []byte) {
	t.Helper()
	if len(stdout) == 0 {
		t.Fatal("nothing on stdout")
	}
	if stdout[0] != '{' {
		t.Errorf("stdout starts with %q, not a JSON object", stdout[:min(len(stdout), 40)])
	}
	if stdout[len(stdout)-1] != '\n' {
		t.Errorf("stdout ends mid-line: %q", tail(string(stdout), 200))
	}
	for i, line := range bytes.Split(bytes.TrimSuffix(stdout, []byte("\n")), []byte("\n")) {
		var m rpcMessage
		if err := json.Unmarshal(line, &m); err != nil || m.JSONRPC != "2.0" {
			t.Errorf("stdout line %d is not a JSON-RPC message: %q", i+1, tail(string(line), 300))
		}
	}
}

// TestStdoutIsProtocolOnly runs both servers at --log-level debug through
// an image build and a command writing to its stdout and stderr, and checks
// stdout carries only protocol messages from the first byte, while the logs
// went to stderr.
func TestStdoutIsProtocolOnly(t *testing.T) {
	testenv.RequireDocker(t)
	for _, mode := range []string{"mcp", "serve"} {
		t.Run(mode, func(t *testing.T) {
			p := newProject(t, "stdout-"+mode, buildingDockerfile())
			s := startServer(t, p, mode, "--log-level", "debug")
			var progress []string
			onNote := func(m rpcMessage) {
				var pp struct {
					Message string `json:"message"`
				}
				_ = json.Unmarshal(m.Params, &pp)
				progress = append(progress, pp.Message)
			}
			createArgs := map[string]any{"checkout": p.dir, "trust": true}
			execArgs := map[string]any{"checkout": p.dir, "cmd": []string{"bash", "-c", "echo to-stdout; echo to-stderr >&2; /bin/echo child-of-child"}}
			var created, executed rpcMessage
			if mode == "mcp" {
				s.send(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
					"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "0"}}})
				if m := s.await("1", time.Minute, nil); m.Error != nil {
					t.Fatalf("initialize: %+v", m.Error)
				}
				s.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
				s.send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{
					"name": "sandbox_create", "arguments": createArgs, "_meta": map[string]any{"progressToken": "build"}}})
				created = s.await("2", 10*time.Minute, onNote)
				s.send(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": map[string]any{"name": "sandbox_exec", "arguments": execArgs}})
				executed = s.await("3", time.Minute, nil)
				for _, m := range []rpcMessage{created, executed} {
					if m.Error != nil || bytes.Contains(m.Result, []byte(`"isError":true`)) {
						t.Fatalf("call failed: %+v %s", m.Error, m.Result)
					}
				}
			} else {
				s.send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "sandbox_create", "params": createArgs})
				created = s.await("2", 10*time.Minute, onNote)
				s.send(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "sandbox_exec", "params": execArgs})
				executed = s.await("3", time.Minute, nil)
				for _, m := range []rpcMessage{created, executed} {
					if m.Error != nil {
						t.Fatalf("call failed: %+v", m.Error)
					}
				}
			}
			if !bytes.Contains(created.Result, []byte(`"image_built":true`)) {
				t.Errorf("no image was built: %s", created.Result)
			}
			if all := strings.Join(progress, "\n"); !strings.Contains(all, "build-output-3") {
				t.Errorf("the build's output did not arrive as progress: %q", tail(all, 2000))
			}
			if !bytes.Contains(executed.Result, []byte(`to-stdout\n`)) {
				t.Errorf("exec result: %s", executed.Result)
			}
			// Closing stdin ends the server cleanly.
			if err := s.stdin.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.wait(time.Minute); err != nil {
				t.Errorf("server exit after stdin closed: %v", err)
			}
			s.mu.Lock()
			out, errOut := append([]byte(nil), s.stdout.Bytes()...), s.stderr.String()
			s.mu.Unlock()
			checkProtocolOnly(t, out)
			if !strings.Contains(errOut, `"level":"debug"`) {
				t.Errorf("no debug log on stderr: %q", tail(errOut, 1000))
			}
			// The sandbox outlives the server.
			if p.processesIn(t, "[v]m-init") == 0 {
				t.Error("the VM is gone after the server exited")
			}
		})
	}
}

// TestSIGTERMEndsCalls: SIGTERM ends both servers cleanly while a long
// call runs: the call's command is killed, the sandbox keeps running.
func TestSIGTERMEndsCalls(t *testing.T) {
	p := sharedProject(t)
	for i, mode := range []string{"mcp", "serve"} {
		t.Run(mode, func(t *testing.T) {
			s := startServer(t, p, mode)
			pat := fmt.Sprintf("[s]leep 31%d", i)
			args := map[string]any{"checkout": p.dir, "cmd": []string{"sleep", fmt.Sprintf("31%d", i)}}
			if mode == "mcp" {
				s.send(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
					"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "0"}}})
				s.await("1", time.Minute, nil)
				s.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
				s.send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "sandbox_create", "arguments": map[string]any{"checkout": p.dir, "trust": true}}})
				s.await("2", 10*time.Minute, nil)
				s.send(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": map[string]any{"name": "sandbox_exec", "arguments": args}})
			} else {
				s.send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "sandbox_create", "params": map[string]any{"checkout": p.dir, "trust": true}})
				s.await("2", 10*time.Minute, nil)
				s.send(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "sandbox_exec", "params": args})
			}
			waitFor(t, time.Minute, "the long command to start", func() bool { return p.processesIn(t, pat) > 0 })
			if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := s.wait(time.Minute); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			waitFor(t, 30*time.Second, "the command to be gone", func() bool { return p.processesIn(t, pat) == 0 })
			if p.processesIn(t, "[v]m-init") == 0 {
				t.Error("the VM is gone after the server exited")
			}
			s.mu.Lock()
			out := append([]byte(nil), s.stdout.Bytes()...)
			s.mu.Unlock()
			checkProtocolOnly(t, out)
		})
	}
}
