// Package tests drives the built agents-sandbox binary as a subprocess: the
// MCP server with the official MCP SDK clients (Go and TypeScript), the
// JSON-RPC server over a unix socket and stdio, stdout purity and shutdown.
// The Docker-backed tests share one checkout (one runner image, one VM)
// that TestMain removes at the end.
package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

// binary is the agents-sandbox binary under test, built once by TestMain
// (CGO_ENABLED=0, as VMs run it as their init). AGENTS_SANDBOX_TEST_BINARY
// names a prebuilt one instead.
var binary string

// projects are the checkouts the tests made; TestMain removes their
// sandboxes, volumes and images.
var projects struct {
	mu   sync.Mutex
	list []*project
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "agents-sandbox-tests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binary = os.Getenv("AGENTS_SANDBOX_TEST_BINARY")
	if binary == "" {
		binary = filepath.Join(tmp, "agents-sandbox")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-trimpath", "-o", binary, "./cmd/agents-sandbox")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build agents-sandbox: %v\n%s", err, out)
			return 1
		}
	}
	for _, mode := range []string{"mcp", "serve"} {
		if out, err := exec.Command(binary, mode, "--help").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "%s has no working %q command (%v): register newMCPCommand(a) and newServeCommand(a) in cmd/agents-sandbox/root.go\n%s", binary, mode, err, out)
			return 1
		}
	}
	code := m.Run()
	projects.mu.Lock()
	defer projects.mu.Unlock()
	for _, p := range projects.list {
		p.cleanup()
	}
	return code
}

// project is a checkout with its own XDG directories (so the servers the
// tests start keep their state apart from the user's).
type project struct {
	root string
	dir  string // the checkout
	env  []string
}

// newProject makes a git checkout using the shell agent on the local
// debian:bookworm-slim base with network.mode "open" (a setting that needs
// the user's trust: tools are called with trust: true). dockerfile, when
// set, is the project's own .agents-sandbox/Dockerfile.
func newProject(t *testing.T, name, dockerfile string) *project {
	t.Helper()
	base := testenv.BaseImage(t)
	root, err := os.MkdirTemp("", "as-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	p := &project{root: root, dir: filepath.Join(root, name)}
	if err := os.MkdirAll(filepath.Join(p.dir, ".agents-sandbox"), 0o755); err != nil {
		t.Fatal(err)
	}
	gittest.Init(t, p.dir)
	cfg := fmt.Sprintf("agent = \"shell\"\nidle_timeout = \"0\"\n[image]\nbase = %q\n[network]\nmode = \"open\"\n", base)
	if err := os.WriteFile(filepath.Join(p.dir, ".agents-sandbox", "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if dockerfile != "" {
		if err := os.WriteFile(filepath.Join(p.dir, ".agents-sandbox", "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gittest.Commit(t, p.dir, "README.md", "hello\n", "initial")
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "XDG_") || strings.HasPrefix(k, "AGENTS_SANDBOX_") || k == "HOME" {
			continue
		}
		p.env = append(p.env, kv)
	}
	p.env = append(p.env, "HOME="+root, "XDG_CONFIG_HOME="+filepath.Join(root, "config"),
		"XDG_STATE_HOME="+filepath.Join(root, "state"), "XDG_CACHE_HOME="+filepath.Join(root, "cache"))
	projects.mu.Lock()
	projects.list = append(projects.list, p)
	projects.mu.Unlock()
	return p
}

var shared struct {
	once sync.Once
	p    *project
}

// sharedProject is the checkout most Docker tests use (one runner image).
func sharedProject(t *testing.T) *project {
	t.Helper()
	testenv.RequireDocker(t)
	shared.once.Do(func() { shared.p = newProject(t, "shared", "") })
	if shared.p == nil {
		t.Fatal("shared project setup failed in an earlier test")
	}
	return shared.p
}

// manager is an in-process Manager over the project's directories, for
// checks and cleanup.
func (p *project) manager(ctx context.Context) (*sandbox.Manager, *sandbox.Project, error) {
	rt, err := docker.New(ctx, docker.Options{Logger: zerolog.Nop()})
	if err != nil {
		return nil, nil, err
	}
	dirs := sandbox.Dirs{Config: filepath.Join(p.root, "config", "agents-sandbox"), State: filepath.Join(p.root, "state", "agents-sandbox"), Cache: filepath.Join(p.root, "cache", "agents-sandbox")}
	m, err := sandbox.NewManager(rt, dirs, zerolog.Nop())
	if err != nil {
		return nil, nil, err
	}
	m.Environ = p.env
	m.InitBinary = binary
	pr, err := m.Open(sandbox.OpenOptions{Dir: p.dir, SkipTrust: true})
	if err != nil {
		return nil, nil, err
	}
	return m, pr, nil
}

// cleanup removes the project's VM, proxy, network, home volume and runner
// image (by its checkout label) and its directories.
func (p *project) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, pr, err := p.manager(ctx)
	if err == nil {
		if _, err := m.Remove(ctx, pr, true); err != nil {
			fmt.Fprintf(os.Stderr, "cleanup %s: %v\n", p.dir, err)
		}
		imgs, err := m.RT.ListImages(ctx, map[string]string{sandbox.LabelCheckout: pr.ID.CheckoutSlug, sandbox.LabelKind: string(sandbox.KindRunner)})
		if err != nil {
			fmt.Fprintf(os.Stderr, "cleanup %s: list images: %v\n", p.dir, err)
		}
		for _, img := range imgs {
			for _, ref := range append(append([]string{}, img.Tags...), img.ID) {
				if err := m.RT.RemoveImage(ctx, ref); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
					fmt.Fprintf(os.Stderr, "cleanup %s: remove image %s: %v\n", p.dir, ref, err)
				}
			}
		}
	}
	os.RemoveAll(p.root)
}

// processesIn counts processes in the project's VM whose command line
// matches the grep regex re ("[s]leep 300", so the search itself does not).
func (p *project) processesIn(t *testing.T, re string) int {
	t.Helper()
	ctx := context.Background()
	m, pr, err := p.manager(ctx)
	if err != nil {
		t.Fatal(err)
	}
	script := `n=0; for f in /proc/[0-9]*/cmdline; do if tr '\0' ' ' <"$f" 2>/dev/null | grep -q -- "$0"; then n=$((n+1)); fi; done; echo $n`
	r, err := m.Exec(ctx, pr, sandbox.ExecOptions{Cmd: []string{"sh", "-c", script, re}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscan(r.Stdout.Text, &n); err != nil {
		t.Fatalf("count processes: %q %q", r.Stdout.Text, r.Stderr.Text)
	}
	return n
}

// waitFor polls cond until it holds (up to limit).
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		<-tick.C
	}
}

// server is a running agents-sandbox process driven over raw pipes.
type server struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout bytes.Buffer // every byte written to stdout
	stderr bytes.Buffer
	lines  chan []byte
	exited chan struct{} // closed when the process has exited; then err is set
	err    error
	mu     sync.Mutex
}

// wait waits up to limit for the process to exit and returns how it ended.
func (s *server) wait(limit time.Duration) error {
	s.t.Helper()
	select {
	case <-s.exited:
		return s.err
	case <-time.After(limit):
		s.t.Fatalf("the server did not exit within %s", limit)
		return nil
	}
}

// startServer runs the binary with args in the project's environment.
func startServer(t *testing.T, p *project, args ...string) *server {
	t.Helper()
	s := &server{t: t, lines: make(chan []byte, 4096), exited: make(chan struct{})}
	s.cmd = exec.Command(binary, args...)
	s.cmd.Env = p.env
	s.cmd.Dir = p.root
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = &lockedWriter{mu: &s.mu, w: &s.stderr}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r := bufio.NewReader(out)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				s.mu.Lock()
				s.stdout.Write(line)
				s.mu.Unlock()
				s.lines <- bytes.TrimRight(line, "\n")
			}
			if err != nil {
				close(s.lines)
				s.err = s.cmd.Wait()
				close(s.exited)
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = s.stdin.Close()
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
		}
		if t.Failed() {
			s.mu.Lock()
			t.Logf("server stderr:\n%s", tail(s.stderr.String(), 8000))
			s.mu.Unlock()
		}
	})
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (s *server) send(v any) {
	s.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.stdin.Write(append(b, '\n')); err != nil {
		s.t.Fatalf("write to server: %v", err)
	}
}

// rpcMessage is any JSON-RPC message.
type rpcMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error,omitempty"`
}

// await reads messages until the response with id arrives; notifications
// on the way are passed to onNote.
func (s *server) await(id string, limit time.Duration, onNote func(rpcMessage)) rpcMessage {
	s.t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				s.t.Fatalf("server exited before answering %s", id)
			}
			var m rpcMessage
			if err := json.Unmarshal(line, &m); err != nil {
				s.t.Fatalf("stdout line is not JSON: %q", line)
			}
			if m.Method != "" {
				if onNote != nil {
					onNote(m)
				}
				continue
			}
			if string(m.ID) == id {
				return m
			}
		case <-timer.C:
			s.t.Fatalf("no answer to %s within %s", id, limit)
		}
	}
}
