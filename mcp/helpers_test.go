package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/mcp"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
	"github.com/agents-sandbox/agents-sandbox/schemas"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// schemaFromDisk returns a schema as package schemas embeds it (what the
// binary serves).
func schemaFromDisk(name string) ([]byte, error) { return schemas.Get(name) }

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

// deadEngineOptions serves the tools over a real Docker driver pointed at
// a socket nobody listens on: every call that needs the engine fails the
// way it does when Docker is down.
func deadEngineOptions(t *testing.T) mcp.Options {
	t.Helper()
	dir := t.TempDir()
	dirs := sandbox.Dirs{Config: filepath.Join(dir, "config"), State: filepath.Join(dir, "state"), Cache: filepath.Join(dir, "cache")}
	log := testLogger(t)
	m, err := sandbox.NewManager(nil, dirs, log)
	if err != nil {
		t.Fatal(err)
	}
	m.Environ = []string{"HOME=" + dir}
	sock := "unix://" + filepath.Join(dir, "no-engine.sock")
	core := &tools.LazyManager{M: m, Connect: func(ctx context.Context) (sandbox.Runtime, error) {
		return docker.New(ctx, docker.Options{Host: sock, Logger: log})
	}}
	return mcp.Options{Registry: tools.All(tools.Deps{Core: core, Log: log}), Schema: schemaFromDisk, Log: log, Version: "test"}
}

// rawConn is a line-level JSON-RPC client: it writes whatever it is given
// and collects every line the server writes.
type rawConn struct {
	t     *testing.T
	c     net.Conn
	lines chan string
}

// pipeRPC serves o over one end of a net.Pipe and returns the other end.
func pipeRPC(t *testing.T, o mcp.Options) *rawConn {
	t.Helper()
	srv, err := mcp.NewRPCServer(o)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeConn(ctx, a)
	}()
	rc := &rawConn{t: t, c: b, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(b)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			rc.lines <- sc.Text()
		}
		close(rc.lines)
	}()
	t.Cleanup(func() {
		b.Close()
		cancel()
		<-done
	})
	return rc
}

func (r *rawConn) send(line string) {
	r.t.Helper()
	if _, err := r.c.Write([]byte(line + "\n")); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// message is any JSON-RPC message the server sends.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// next returns the next message that is not a notification.
func (r *rawConn) next() message {
	r.t.Helper()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case line, ok := <-r.lines:
			if !ok {
				r.t.Fatal("the server closed the connection")
			}
			var m message
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				r.t.Fatalf("server wrote a line that is not JSON: %q", line)
			}
			if m.JSONRPC != "2.0" {
				r.t.Fatalf("server wrote a message without jsonrpc 2.0: %q", line)
			}
			if m.Method != "" {
				continue
			}
			return m
		case <-timeout.C:
			r.t.Fatal("no answer within 2 minutes")
		}
	}
}

func pipe() (net.Conn, net.Conn) { return net.Pipe() }
