package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/rs/zerolog"
	"github.com/sourcegraph/jsonrpc2"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// JSON-RPC methods besides the tools.
const (
	// MethodToolsList answers {"tools": [descriptor…]}: name, title,
	// description, inputSchema, outputSchema and annotations of every tool.
	MethodToolsList = "tools/list"
	// MethodCancel is the notification {"id": ID} that cancels the call with
	// that id; the call then answers -32800.
	MethodCancel = "$/cancelRequest"
	// MethodProgress is the server's notification
	// {"id": ID, "progress": N, "total"?: N, "message"?: TEXT} about the
	// call with that id.
	MethodProgress = "$/progress"
)

// RPCServer serves the tools as plain JSON-RPC 2.0: the method is the tool's
// name, params the tool's input object, result its output object (see each
// tool's schemas). Safe for many connections at once.
type RPCServer struct {
	d   *dispatcher
	log zerolog.Logger
}

// NewRPCServer compiles the tools' schemas and returns a server.
func NewRPCServer(o Options) (*RPCServer, error) {
	d, err := newDispatcher(o)
	if err != nil {
		return nil, err
	}
	return &RPCServer{d: d, log: o.Log.With().Str("frontend", "jsonrpc").Logger()}, nil
}

// ServeConn serves one connection (newline-delimited JSON in both
// directions) until the peer closes it or ctx is cancelled, then cancels the
// calls still running, waits for them and returns. Calls run concurrently:
// a slow call never delays reading the next message or a cancellation.
func (s *RPCServer) ServeConn(ctx context.Context, rw io.ReadWriteCloser) error {
	return s.serveConn(ctx, rw, false)
}

// serveConn is ServeConn; with finishOnEOF the end of the input does not
// cancel the calls in flight: they run to the end and are answered first
// (for a script that pipes its requests in and closes its end).
func (s *RPCServer) serveConn(ctx context.Context, rw io.ReadWriteCloser, finishOnEOF bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &rpcHandler{s: s, ctx: ctx, inflight: map[jsonrpc2.ID]context.CancelFunc{}}
	if finishOnEOF {
		rw = &drainOnEOF{ReadWriteCloser: rw, wait: h.wg.Wait}
	}
	stream := newLineStream(rw, MaxMessageBytes, func(code int, msg string) {
		s.log.Debug().Int("code", code).Str("error", msg).Msg("bad message")
	})
	conn := jsonrpc2.NewConn(ctx, stream, h, jsonrpc2.SetLogger(printfLogger{s.log}))
	select {
	case <-conn.DisconnectNotify():
	case <-ctx.Done():
		_ = conn.Close()
	}
	cancel()
	h.wg.Wait()
	return nil
}

// ServeStdio serves one JSON-RPC connection over in and out. When in ends,
// the calls still running are finished and answered before it returns
// (cancelling ctx, as SIGTERM does, cancels them instead).
func (s *RPCServer) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	return s.serveConn(ctx, stdioConn{in: in, out: out}, true)
}

// drainOnEOF holds back the end of the input until the calls in flight have
// been answered. Calls register (wg.Add) while their request is handled on
// the read loop, so every call read before the end is waited for.
type drainOnEOF struct {
	io.ReadWriteCloser
	wait func()
}

func (d *drainOnEOF) Read(p []byte) (int, error) {
	n, err := d.ReadWriteCloser.Read(p)
	if errors.Is(err, io.EOF) && n == 0 {
		d.wait()
	}
	return n, err
}

type stdioConn struct {
	in  io.Reader
	out io.Writer
}

func (c stdioConn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c stdioConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c stdioConn) Close() error {
	if cl, ok := c.in.(io.Closer); ok {
		_ = cl.Close()
	}
	return nil
}

// ListenUnix serves JSON-RPC on a unix socket at path, one ServeConn per
// connection, until ctx is cancelled; then it stops accepting, cancels the
// calls in flight, waits for them and removes the socket. The socket is
// created with mode 0600 (in a private directory, then renamed into place).
// A stale socket file at path is replaced; one a server still answers on is
// an error, and so is any other kind of file. ready, if not nil, is called
// once the socket accepts connections.
func (s *RPCServer) ListenUnix(ctx context.Context, path string, ready func()) error {
	path, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := clearStaleSocket(path); err != nil {
		return err
	}
	tmpDir, err := os.MkdirTemp(filepath.Dir(path), ".as-*") // short: socket paths are limited to 107 bytes
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	defer os.Remove(path)
	s.log.Info().Str("socket", path).Msg("serving JSON-RPC")
	if ready != nil {
		ready()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept on %s: %w", path, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = s.ServeConn(ctx, c)
		}()
	}
}

// clearStaleSocket removes a socket file nobody answers on.
func clearStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("listen on %s: the path exists and is not a socket; remove it or choose another path", path)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("listen on %s: another server is already listening there; stop it or choose another path", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// rpcHandler dispatches one connection's messages. Handle runs on the read
// loop, in message order: it registers a call's cancel function before
// starting the call on its own goroutine, so a $/cancelRequest that follows
// its request always finds it.
type rpcHandler struct {
	s   *RPCServer
	ctx context.Context
	wg  sync.WaitGroup

	mu       sync.Mutex
	inflight map[jsonrpc2.ID]context.CancelFunc
}

func (h *rpcHandler) Handle(_ context.Context, conn *jsonrpc2.Conn, req *jsonrpc2.Request) {
	switch req.Method {
	case MethodCancel:
		var p struct {
			ID *jsonrpc2.ID `json:"id"`
		}
		if req.Params == nil || json.Unmarshal(*req.Params, &p) != nil || p.ID == nil {
			h.replyError(conn, req, &tools.Error{Code: tools.CodeInvalidParams, Kind: tools.KindInvalidParams, Pointer: "/id", Message: MethodCancel + ` needs params {"id": ID}`})
			return
		}
		h.mu.Lock()
		cancel := h.inflight[*p.ID]
		h.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		if !req.Notif {
			h.reply(conn, req, map[string]bool{"cancelled": cancel != nil})
		}
		return
	case MethodToolsList:
		list := make([]toolDescriptor, 0, len(h.s.d.tools))
		for _, sv := range h.s.d.tools {
			list = append(list, sv.descriptor())
		}
		h.reply(conn, req, map[string]any{"tools": list})
		return
	}
	sv, ok := h.s.d.byName[req.Method]
	if !ok {
		if req.Notif {
			return
		}
		e := &jsonrpc2.Error{Code: codeMethodNotFound, Message: fmt.Sprintf("method %q not found; the methods are the tool names, %s and %s", req.Method, MethodToolsList, MethodCancel)}
		e.SetError(map[string]string{"kind": "method_not_found", "method": req.Method})
		h.send(conn, req, nil, e)
		return
	}
	if req.Notif {
		h.s.log.Warn().Str("method", req.Method).Msg("a tool call sent as a notification (no id) is ignored")
		return
	}
	ctx, cancel := context.WithCancel(h.ctx)
	h.mu.Lock()
	if _, dup := h.inflight[req.ID]; dup {
		h.mu.Unlock()
		cancel()
		e := &jsonrpc2.Error{Code: codeInvalidRequest, Message: fmt.Sprintf("a call with id %s is still running; use a new id for every request", req.ID)}
		e.SetError(map[string]string{"kind": "invalid_request"})
		h.send(conn, req, nil, e)
		return
	}
	h.inflight[req.ID] = cancel
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		res, terr := h.run(ctx, conn, req, sv)
		// Forget the id before answering: the caller may reuse it as soon
		// as it has the answer.
		h.mu.Lock()
		delete(h.inflight, req.ID)
		h.mu.Unlock()
		cancel()
		if terr != nil {
			h.replyError(conn, req, terr)
			return
		}
		h.reply(conn, req, res.Structured)
	}()
}

func (h *rpcHandler) run(ctx context.Context, conn *jsonrpc2.Conn, req *jsonrpc2.Request, sv *served) (tools.Result, *tools.Error) {
	id := req.ID
	th := newThrottle(h.s.d.opts.ProgressInterval, func(p tools.Progress) error {
		params := map[string]any{"id": id, "progress": p.Current}
		if p.Total > 0 {
			params["total"] = p.Total
		}
		if p.Message != "" {
			params["message"] = p.Message
		}
		return conn.Notify(context.WithoutCancel(ctx), MethodProgress, params)
	})
	var args json.RawMessage
	if req.Params != nil {
		args = *req.Params
	}
	res, terr := h.s.d.call(ctx, sv, args, th.report)
	th.close()
	return res, terr
}

func (h *rpcHandler) reply(conn *jsonrpc2.Conn, req *jsonrpc2.Request, result any) {
	if err := conn.Reply(context.Background(), req.ID, result); err != nil && !errors.Is(err, jsonrpc2.ErrClosed) {
		h.s.log.Debug().Err(err).Str("method", req.Method).Msg("reply not sent")
	}
}

func (h *rpcHandler) replyError(conn *jsonrpc2.Conn, req *jsonrpc2.Request, terr *tools.Error) {
	if req.Notif {
		return
	}
	e := &jsonrpc2.Error{Code: int64(terr.Code), Message: terr.Message}
	e.SetError(terr.Data())
	h.send(conn, req, nil, e)
}

func (h *rpcHandler) send(conn *jsonrpc2.Conn, req *jsonrpc2.Request, _ any, e *jsonrpc2.Error) {
	if err := conn.ReplyWithError(context.Background(), req.ID, e); err != nil && !errors.Is(err, jsonrpc2.ErrClosed) {
		h.s.log.Debug().Err(err).Str("method", req.Method).Msg("error reply not sent")
	}
}

// printfLogger routes jsonrpc2's log lines to zerolog.
type printfLogger struct{ l zerolog.Logger }

func (p printfLogger) Printf(format string, v ...any) { p.l.Debug().Msgf(format, v...) }
