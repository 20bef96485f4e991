package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWithoutEngine starts both servers with DOCKER_HOST pointing at a
// socket nobody listens on: they start, list the tools, answer calls that
// need the engine with "runtime unavailable" and a fix, and keep stdout
// for the protocol.
func TestWithoutEngine(t *testing.T) {
	root := t.TempDir()
	p := &project{root: root, dir: filepath.Join(root, "checkout")}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "XDG_") || strings.HasPrefix(k, "AGENTS_SANDBOX_") || k == "HOME" || k == "DOCKER_HOST" {
			continue
		}
		p.env = append(p.env, kv)
	}
	p.env = append(p.env, "HOME="+root, "DOCKER_HOST=unix://"+filepath.Join(root, "no-engine.sock"))

	for _, mode := range []string{"mcp", "serve"} {
		t.Run(mode, func(t *testing.T) {
			s := startServer(t, p, mode, "--log-level", "debug")
			var answer rpcMessage
			if mode == "mcp" {
				s.send(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
					"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "0"}}})
				s.await("1", time.Minute, nil)
				s.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
				s.send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
				if m := s.await("2", time.Minute, nil); !bytes.Contains(m.Result, []byte("sandbox_spawn_task")) {
					t.Errorf("tools/list: %s", m.Result)
				}
				s.send(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": map[string]any{"name": "sandbox_status", "arguments": map[string]any{"checkout": p.dir}}})
				answer = s.await("3", time.Minute, nil)
				var res struct {
					IsError bool `json:"isError"`
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				}
				if err := json.Unmarshal(answer.Result, &res); err != nil || !res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, "start the Docker engine") {
					t.Errorf("status without an engine: %s", answer.Result)
				}
			} else {
				s.send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
				if m := s.await("2", time.Minute, nil); !bytes.Contains(m.Result, []byte("sandbox_spawn_task")) {
					t.Errorf("tools/list: %s", m.Result)
				}
				s.send(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "sandbox_status", "params": map[string]any{"checkout": p.dir}})
				answer = s.await("3", time.Minute, nil)
				if answer.Error == nil || answer.Error.Code != -32002 || !strings.Contains(answer.Error.Message, "start the Docker engine") {
					t.Errorf("status without an engine: %+v", answer.Error)
				}
			}
			if err := s.stdin.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.wait(time.Minute); err != nil {
				t.Errorf("exit: %v", err)
			}
			s.mu.Lock()
			out := append([]byte(nil), s.stdout.Bytes()...)
			s.mu.Unlock()
			checkProtocolOnly(t, out)
		})
	}
}
