package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// server is one of our long-running CLI processes (mcp, serve) speaking
// line-delimited JSON-RPC 2.0.
type server struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	conn  net.Conn // set for a unix-socket connection: in and out are on it
	pid   string
	next  int
	waitc chan error
	once  sync.Once
}

// startServer starts our binary with args. Stdout is the protocol when conn
// is nil; stderr goes to ours.
func (e *Env) startServer(ctx context.Context, stdio bool, args ...string) (*server, error) {
	cmd := exec.CommandContext(ctx, e.Bin, args...)
	cmd.Env = e.environ()
	cmd.Stderr = os.Stderr
	s := &server{cmd: cmd, waitc: make(chan error, 1)}
	if stdio {
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		s.in, s.out = in, bufio.NewReaderSize(out, 1<<20)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agents-sandbox %s: %w", strings.Join(args, " "), err)
	}
	s.pid = strconv.Itoa(cmd.Process.Pid)
	go func() { s.waitc <- cmd.Wait() }()
	return s, nil
}

// stop ends the server: closing stdin (stdio) or SIGINT (socket), then
// waits for it. It returns ru_maxrss. Later calls only return it again.
func (s *server) stop() int64 {
	s.once.Do(s.doStop)
	return rusageMaxRSS(s.cmd.ProcessState)
}

func (s *server) doStop() {
	if s.conn != nil {
		_ = s.conn.Close()
	}
	if s.in != nil && s.conn == nil {
		_ = s.in.Close()
	} else {
		_ = s.cmd.Process.Signal(os.Interrupt)
	}
	select {
	case <-s.waitc:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.waitc
	}
}

// rpcResponse is a JSON-RPC response (notifications have no id and are
// skipped).
type rpcResponse struct {
	ID     *int            `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// call sends one request and reads lines until its response.
func (s *server) call(method string, params any) (json.RawMessage, error) {
	s.next++
	id := s.next
	req, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	if _, err := s.in.Write(append(req, '\n')); err != nil {
		return nil, fmt.Errorf("%s: write: %w", method, err)
	}
	for {
		line, err := s.out.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("%s: read: %w", method, err)
		}
		var r rpcResponse
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s: bad response %q: %w", method, line, err)
		}
		if r.ID == nil || *r.ID != id {
			continue // a notification ($/progress, …)
		}
		if r.Error != nil {
			return nil, fmt.Errorf("%s: error %d: %s", method, r.Error.Code, r.Error.Message)
		}
		return r.Result, nil
	}
}

func (s *server) notify(method string, params any) error {
	req, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	if err != nil {
		return err
	}
	_, err = s.in.Write(append(req, '\n'))
	return err
}

// startMCP starts `agents-sandbox mcp` and completes the initialize
// handshake.
func (e *Env) startMCP(ctx context.Context) (*server, error) {
	s, err := e.startServer(ctx, true, "mcp")
	if err != nil {
		return nil, err
	}
	_, err = s.call("initialize", map[string]any{
		"protocolVersion": "2025-06-18",
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": "agents-sandbox-bench", "version": "0"},
	})
	if err == nil {
		err = s.notify("notifications/initialized", map[string]any{})
	}
	if err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// mcpStatus is one tools/call of sandbox_status; a tool error fails it.
func (e *Env) mcpStatus(s *server) error {
	res, err := s.call("tools/call", map[string]any{"name": "sandbox_status", "arguments": map[string]any{"checkout": e.Checkout, "agent": agent}})
	if err != nil {
		return err
	}
	var r struct {
		IsError bool              `json:"isError"`
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return fmt.Errorf("sandbox_status: %w", err)
	}
	if r.IsError {
		return fmt.Errorf("sandbox_status: tool error: %s", res)
	}
	return nil
}

// Row 7, MCP over stdio.
func runMCP(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	s, err := e.startMCP(ctx)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	ours := func() error { return e.mcpStatus(s) }
	baseline := func() error {
		_, err := dockerCLI(ctx, "container", "inspect", e.VM)
		return err
	}
	o, b, err := interleave(f.calls, 10, ours, baseline)
	if err != nil {
		return nil, err
	}
	mem, err := readProcMem(s.pid)
	if err != nil {
		return nil, err
	}
	rows := latencyRows("7a", "MCP tools/call sandbox_status over stdio, round trip", "`agents-sandbox mcp` process, one session", "`docker container inspect` process per call", o, b)
	for i := range rows {
		rows[i].PeakRSSMiB, rows[i].RSSSource = mib(mem.HWM), "VmHWM of the `agents-sandbox mcp` process after all calls"
	}
	rss := s.stop()
	rows[0].Notes = append(rows[0].Notes, fmt.Sprintf("mcp process: VmRSS %.1f MiB after %d calls; ru_maxrss after exit %.1f MiB", mib(mem.RSS), f.calls+10, mib(rss)))
	return rows, nil
}

// dockerSocket returns the engine's unix socket path (DOCKER_HOST or the
// default).
func dockerSocket() (string, error) {
	h := os.Getenv("DOCKER_HOST")
	if h == "" {
		return "/var/run/docker.sock", nil
	}
	if p, ok := strings.CutPrefix(h, "unix://"); ok {
		return p, nil
	}
	return "", fmt.Errorf("DOCKER_HOST=%s is not a unix socket; the JSON-RPC row compares with the engine API over its unix socket", h)
}

// Row 7, JSON-RPC over a unix socket.
func runRPC(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	sock := filepath.Join(e.Root, "rpc.sock")
	s, err := e.startServer(ctx, false, "serve", "--listen", "unix:"+sock)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	conn, err := dialWhenReady(ctx, sock, s.waitc)
	if err != nil {
		return nil, err
	}
	s.conn, s.in, s.out = conn, conn, bufio.NewReaderSize(conn, 1<<20)
	params := map[string]any{"checkout": e.Checkout, "agent": agent}
	ours := func() error {
		_, err := s.call("sandbox_status", params)
		return err
	}

	dsock, err := dockerSocket()
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", dsock)
		},
		MaxIdleConnsPerHost: 1,
	}}
	url := "http://docker/v1.41/containers/" + e.VM + "/json"
	baseline := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("engine API: %s", resp.Status)
		}
		return nil
	}
	o, b, err := interleave(f.calls, 10, ours, baseline)
	if err != nil {
		return nil, err
	}
	mem, err := readProcMem(s.pid)
	if err != nil {
		return nil, err
	}
	// Where ours spends its time: the two Manager calls a sandbox_status
	// makes, in-process.
	breakdown, err := statusBreakdown(ctx, e, 100)
	if err != nil {
		return nil, err
	}
	rows := latencyRows("7b", "JSON-RPC sandbox_status over a unix socket, round trip", "`agents-sandbox serve --listen unix:…`, one connection", "Docker Engine API GET /containers/{name}/json over its unix socket, keep-alive", o, b)
	for i := range rows {
		rows[i].PeakRSSMiB, rows[i].RSSSource = mib(mem.HWM), "VmHWM of the `agents-sandbox serve` process after all calls"
	}
	rows[0].Notes = append(rows[0].Notes, breakdown)
	return rows, nil
}

// statusBreakdown times, in-process, the Manager.Open (resolve the checkout
// with git, load the config layers) and Manager.Status that every
// sandbox_status call makes.
func statusBreakdown(ctx context.Context, e *Env, n int) (string, error) {
	m, _, _, err := e.manager(ctx)
	if err != nil {
		return "", err
	}
	var open, status []float64
	for i := 0; i < n; i++ {
		t := time.Now()
		p, err := m.Open(sandbox.OpenOptions{Dir: e.Checkout, Agent: agent, SkipTrust: true})
		if err != nil {
			return "", err
		}
		t1 := time.Now()
		if _, err := m.Status(ctx, p); err != nil {
			return "", err
		}
		open, status = append(open, ms(t1.Sub(t))), append(status, ms(time.Since(t1)))
	}
	return fmt.Sprintf("in-process breakdown over %d calls, median: Manager.Open %.2f ms (git and config layers), Manager.Status %.2f ms", n, summarize(open).Median, summarize(status).Median), nil
}

// dialWhenReady dials the unix socket a server we started is about to
// listen on, retrying until it answers, the server exits or 30 s pass.
func dialWhenReady(ctx context.Context, path string, exited <-chan error) (net.Conn, error) {
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn, nil
		}
		select {
		case werr := <-exited:
			return nil, fmt.Errorf("server exited before listening on %s: %v", path, werr)
		case <-deadline.C:
			return nil, fmt.Errorf("nothing listens on %s after 30 s: %w", path, err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// Row 9: memory of an idle MCP server, and of an idle Docker CLI process.
func runMemMCP(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	s, err := e.startMCP(ctx)
	if err != nil {
		return nil, err
	}
	mem, err := readProcMem(s.pid)
	s.stop()
	if err != nil {
		return nil, err
	}

	// The baseline: a long-lived Docker CLI process waiting on the engine
	// (`docker events`), read once it has printed an event we caused.
	vol := e.baselineName("events")
	cmd := exec.CommandContext(ctx, "docker", "events", "--filter", "type=volume", "--filter", "volume="+vol, "--format", "{{.Type}} {{.Action}}")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = dockerCLI(rctx, "volume", "rm", "-f", vol)
	}()
	// The event stream starts when the CLI's request is accepted; create
	// volumes until one shows up (the first normally does).
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var base procMem
	deadline := time.After(30 * time.Second)
	for got := false; !got; {
		if _, err := dockerCLI(ctx, "volume", "create", "--label", benchLabel+"="+e.RunID, vol); err != nil {
			return nil, err
		}
		select {
		case l, ok := <-lines:
			if !ok {
				return nil, errors.New("docker events ended")
			}
			got = strings.HasPrefix(l, "volume")
		case <-time.After(2 * time.Second):
		case <-deadline:
			return nil, errors.New("docker events printed nothing in 30 s")
		}
		if _, err := dockerCLI(ctx, "volume", "rm", "-f", vol); err != nil {
			return nil, err
		}
	}
	base, err = readProcMem(strconv.Itoa(cmd.Process.Pid))
	if err != nil {
		return nil, err
	}
	r := Row{ID: "9a", Operation: "RSS of an idle `agents-sandbox mcp` process (after initialize)", Ours: "VmRSS of `agents-sandbox mcp` once it answered initialize", Baseline: "VmRSS of an idle `docker events` CLI process, connected", Unit: "MiB", Figure: "single", Better: "lower", OursValue: mib(mem.RSS), BaseValue: mib(base.RSS)}
	r.Ratio = ratio(r.OursValue, r.BaseValue)
	r.PeakRSSMiB, r.RSSSource = mib(mem.HWM), "VmHWM of the `agents-sandbox mcp` process"
	return []Row{r}, nil
}
