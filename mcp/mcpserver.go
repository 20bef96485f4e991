package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// instructions tell an MCP client what the server is for.
const instructions = `agents-sandbox gives a coding agent its own sandbox VM per project checkout: the checkout at /workspace, ` +
	`a persistent /home/dev, and secrets the VM never holds. Every tool takes "checkout", the absolute path of the project. ` +
	`Start with sandbox_create, then sandbox_exec to run commands; sandbox_spawn_task runs a command in a throwaway copy and returns a diff.`

// NewMCPServer returns an MCP server offering every tool of o.Registry with
// its schemas served verbatim. Each call validates its arguments against the
// input schema before the handler runs; failures the caller can act on are
// results with isError and a message naming the fix. A progress token in the
// request's _meta turns on progress notifications (throttled to
// o.ProgressInterval, coalesced). notifications/cancelled cancels the call's
// context, which stops the work it started.
func NewMCPServer(o Options) (*server.MCPServer, error) {
	return newMCPServer(o, nil)
}

// newMCPServer is NewMCPServer; pw, when set, is the stdio output, which a
// call watches so that its progress notifications are written before its
// result.
func newMCPServer(o Options, pw *progressWriter) (*server.MCPServer, error) {
	d, err := newDispatcher(o)
	if err != nil {
		return nil, err
	}
	d.pw = pw
	s := server.NewMCPServer("agents-sandbox", versionOr(o.Version),
		server.WithToolCapabilities(false),
		server.WithInstructions(instructions),
		server.WithRecovery(),
		server.WithLogger(slog.New(zerolog.NewSlogHandler(o.Log.With().Str("frontend", "mcp").Logger()))),
	)
	for _, sv := range d.tools {
		desc := sv.descriptor()
		t := mcpgo.NewToolWithRawSchema(desc.Name, desc.Description, desc.InputSchema)
		t.RawOutputSchema = desc.OutputSchema
		t.Title = desc.Title
		t.Annotations = mcpgo.ToolAnnotation{
			Title:           desc.Annotations.Title,
			ReadOnlyHint:    mcpgo.ToBoolPtr(desc.Annotations.ReadOnlyHint),
			DestructiveHint: mcpgo.ToBoolPtr(desc.Annotations.DestructiveHint),
			IdempotentHint:  mcpgo.ToBoolPtr(desc.Annotations.IdempotentHint),
			OpenWorldHint:   mcpgo.ToBoolPtr(desc.Annotations.OpenWorldHint),
		}
		s.AddTool(t, d.mcpHandler(s, sv))
	}
	return s, nil
}

func versionOr(v string) string {
	if v == "" {
		return "devel"
	}
	return v
}

func (d *dispatcher) mcpHandler(s *server.MCPServer, sv *served) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		args := req.Params.RawArguments
		if len(args) == 0 && req.Params.Arguments != nil {
			b, err := json.Marshal(req.Params.Arguments)
			if err != nil {
				return nil, fmt.Errorf("encode arguments: %w", err)
			}
			args = b
		}
		var progress func(tools.Progress)
		var th *throttle
		if req.Params.Meta != nil && req.Params.Meta.ProgressToken != nil {
			token := req.Params.Meta.ProgressToken
			th = newThrottle(d.opts.ProgressInterval, func(p tools.Progress) error {
				params := map[string]any{"progressToken": token, "progress": p.Current}
				if p.Total > 0 {
					params["total"] = p.Total
				}
				if p.Message != "" {
					params["message"] = p.Message
				}
				err := s.SendNotificationToClient(ctx, "notifications/progress", params)
				if err == nil && d.pw != nil {
					d.pw.queued()
				}
				return err
			})
			progress = th.report
		}
		res, terr := d.call(ctx, sv, args, progress)
		if th != nil {
			th.close()
			if d.pw != nil {
				d.pw.waitWritten(2 * time.Second)
			} else {
				drainNotifications(ctx)
			}
		}
		if terr != nil {
			return mcpgo.NewToolResultError(terr.Message), nil
		}
		js, err := json.Marshal(res.Structured)
		if err != nil {
			return nil, fmt.Errorf("encode %s result: %w", sv.tool.Name, err)
		}
		return &mcpgo.CallToolResult{
			Content: []mcpgo.Content{
				mcpgo.NewTextContent(res.Text),
				mcpgo.NewTextContent(string(js)),
			},
			StructuredContent: json.RawMessage(js),
		}, nil
	}
}

// drainNotifications waits (at most a second) until the session's queue of
// notifications is empty, so that a call's last progress notifications are
// written before its result on transports that write them separately.
func drainNotifications(ctx context.Context) {
	sess := server.ClientSessionFromContext(ctx)
	if sess == nil {
		return
	}
	ch := sess.NotificationChannel()
	if len(ch) == 0 {
		return
	}
	deadline := time.NewTimer(time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for len(ch) > 0 {
		select {
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

// ServeMCP serves MCP over stdio: newline-delimited JSON-RPC messages read
// from in, written to out (nothing else is ever written to out). It returns
// nil when in reaches EOF or ctx is cancelled, after the calls in flight
// have been cancelled and have returned. Only one may run per process (the
// stdio session of mcp-go is process-wide).
func ServeMCP(ctx context.Context, o Options, in io.Reader, out io.Writer) error {
	pw := newProgressWriter(out)
	s, err := newMCPServer(o, pw)
	if err != nil {
		return err
	}
	out = pw
	stdio := server.NewStdioServer(s)
	stdio.SetErrorLogger(log.New(zerologWriter{o.Log.With().Str("frontend", "mcp").Logger()}, "", 0))
	workers := o.Workers
	if workers <= 0 {
		workers = 64
	}
	server.WithWorkerPoolSize(min(workers, 100))(stdio)
	server.WithQueueSize(1000)(stdio)
	err = stdio.Listen(ctx, newBoundedLines(in, MaxMessageBytes, o.Log), out)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
		return nil
	}
	return fmt.Errorf("serve MCP over stdio: %w", err)
}

// zerologWriter adapts a zerolog.Logger to the io.Writer a log.Logger takes.
type zerologWriter struct{ l zerolog.Logger }

func (w zerologWriter) Write(p []byte) (int, error) {
	msg := string(p)
	for len(msg) > 0 && (msg[len(msg)-1] == '\n' || msg[len(msg)-1] == '\r') {
		msg = msg[:len(msg)-1]
	}
	w.l.Warn().Msg(msg)
	return len(p), nil
}

// boundedLines passes newline-delimited messages through unchanged, except
// that a line longer than max is skipped (in pieces, never held whole) and
// replaced by a line that is not JSON, which the MCP server answers with a
// parse error (-32700). mcp-go itself reads lines without a limit.
type boundedLines struct {
	r       *bufio.Reader
	max     int
	pending []byte
	log     zerolog.Logger
}

func newBoundedLines(in io.Reader, max int, log zerolog.Logger) *boundedLines {
	return &boundedLines{r: bufio.NewReaderSize(in, 64<<10), max: max, log: log}
}

func (b *boundedLines) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		line, err := b.readLine()
		if len(line) > 0 {
			b.pending = line
			break
		}
		if err != nil {
			return 0, err
		}
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

// readLine returns the next line with its newline, or the replacement for
// an oversized one.
func (b *boundedLines) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := b.r.ReadSlice('\n')
		if len(buf)+len(chunk) > b.max+1 {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = b.r.ReadSlice('\n')
			}
			b.log.Warn().Int("limit_bytes", b.max).Msg("a message over the size limit was skipped")
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return []byte("message over the 16 MiB limit\n"), nil
		}
		buf = append(buf, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return buf, err
	}
}

// progressWriter is the stdio output of the MCP server. It counts the
// progress notifications written, so that a call can wait until the ones it
// queued are out before its result is written: mcp-go writes notifications
// from a goroutine of their own, and a client (the TypeScript SDK) drops
// progress that arrives after the result.
type progressWriter struct {
	w       io.Writer
	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever written grows
	sent    int64         // queued with mcp-go
	written int64         // written to w
}

func newProgressWriter(w io.Writer) *progressWriter {
	return &progressWriter{w: w, changed: make(chan struct{})}
}

// Write writes one message (mcp-go writes each with one call).
func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if bytes.Contains(b, []byte(`"notifications/progress"`)) {
		p.mu.Lock()
		p.written++
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	return n, err
}

func (p *progressWriter) queued() {
	p.mu.Lock()
	p.sent++
	p.mu.Unlock()
}

// waitWritten waits (at most max) until every notification queued so far
// has been written.
func (p *progressWriter) waitWritten(max time.Duration) {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	p.mu.Lock()
	target := p.sent
	for p.written < target {
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
}
