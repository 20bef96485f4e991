package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// ociExecFailed starts the message the engine sends instead of output when a
// command cannot be started (missing executable, no permission).
const ociExecFailed = "OCI runtime exec failed"

// Exec runs req.Cmd in a running VM.
//
// Without a TTY the engine multiplexes stdout and stderr on one connection;
// they are demultiplexed into req.Stdout and req.Stderr (nil discards). With
// a TTY all terminal output goes to req.Stdout and req.Resize is followed, its
// first size applied right after the command starts. req.Stdin, when set, is
// copied to the command and its stdin closed at EOF; a Stdin that never
// returns keeps one goroutine blocked on it after Exec returns.
//
// Output is read until every process holding the command's stdout and
// stderr has closed them (a background child that keeps them open keeps Exec
// waiting, as with docker exec). The result is the command's exit code, read
// from the engine once the command has ended. A command that cannot be started is an exit code, not an
// error: 127 when the executable does not exist, 126 when it cannot be
// executed, with the engine's message on req.Stderr (req.Stdout with a TTY).
//
// With req.Detach the command is started and Exec returns at once with
// ExitCode -1 (or 126/127 when it could not start).
//
// Cancelling ctx closes the connection and returns ctx's error promptly; the
// command itself keeps running (the API cannot kill an exec).
//
// Errors: ErrNotFound for a missing VM, ErrConflict for one not running,
// ErrInvalid for an empty command.
func (d *Driver) Exec(ctx context.Context, name string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	op := fmt.Sprintf("exec %q in VM %q", strings.Join(req.Cmd, " "), name)
	if len(req.Cmd) == 0 {
		return sandbox.ExecResult{}, fmt.Errorf("exec in VM %q: %w: empty command", name, sandbox.ErrInvalid)
	}
	stdout, stderr := orDiscard(req.Stdout), orDiscard(req.Stderr)
	attach := !req.Detach
	created, err := d.cli.ExecCreate(ctx, name, client.ExecCreateOptions{
		User:         req.User,
		TTY:          req.TTY,
		AttachStdin:  attach && req.Stdin != nil,
		AttachStdout: attach,
		AttachStderr: attach,
		Env:          req.Env,
		WorkingDir:   req.WorkDir,
		Cmd:          req.Cmd,
	})
	if err != nil {
		return sandbox.ExecResult{}, d.wrap(op, err)
	}
	id := created.ID

	if req.Detach {
		_, err := d.cli.ExecStart(ctx, id, client.ExecStartOptions{Detach: true, TTY: req.TTY})
		if err != nil {
			if code, ok := d.startFailure(ctx, id, err, stderr); ok {
				return sandbox.ExecResult{ExitCode: code}, nil
			}
			return sandbox.ExecResult{}, d.wrap(op, err)
		}
		return sandbox.ExecResult{ExitCode: -1}, nil
	}

	var first *sandbox.TermSize
	attachOpts := client.ExecAttachOptions{TTY: req.TTY}
	if req.TTY && req.Resize != nil {
		select {
		case sz, ok := <-req.Resize:
			if ok {
				first = &sz
				// Honoured from API 1.42 on; older engines get the resize below.
				attachOpts.ConsoleSize = client.ConsoleSize{Height: uint(sz.Rows), Width: uint(sz.Cols)}
			}
		default:
		}
	}
	att, err := d.cli.ExecAttach(ctx, id, attachOpts)
	if err != nil {
		if code, ok := d.startFailure(ctx, id, err, stderr); ok {
			return sandbox.ExecResult{ExitCode: code}, nil
		}
		return sandbox.ExecResult{}, d.wrap(op, err)
	}
	defer att.Close()
	// Cancelling ctx does not close a hijacked connection: do it here.
	stop := context.AfterFunc(ctx, att.Close)
	defer stop()

	execCtx, execDone := context.WithCancel(ctx)
	defer execDone()
	if req.TTY && req.Resize != nil {
		go d.followResize(execCtx, id, first, req.Resize)
	}
	if req.Stdin != nil {
		go func() {
			if _, err := io.Copy(att.Conn, req.Stdin); err != nil && execCtx.Err() == nil {
				d.log.Debug().Err(err).Str("vm", name).Msg("exec stdin copy ended")
			}
			_ = att.CloseWrite()
		}()
	}

	sniff := &startErrSniffer{w: stdout, divert: stderr}
	if req.TTY {
		sniff.divert = stdout
		_, err = io.Copy(sniff, att.Reader)
	} else {
		// Never trust the reported media type: 20.10 sends raw-stream for
		// a multiplexed stream too.
		_, err = stdcopy.StdCopy(sniff, stderr, att.Reader)
	}
	sniff.flush()
	if ctx.Err() != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%s: %w", op, ctx.Err())
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return sandbox.ExecResult{}, d.wrap(op+": read output", err)
	}
	code, err := d.waitExec(ctx, id)
	if err != nil {
		return sandbox.ExecResult{}, d.wrap(op, err)
	}
	if sniff.diverted {
		code = startExitCode(code, sniff.msg.String())
	}
	return sandbox.ExecResult{ExitCode: code}, nil
}

// startFailure recognises a command the engine could not start (reported as
// an API error by some engines and in detach mode). It writes the message to
// w and returns the exec's exit code.
func (d *Driver) startFailure(ctx context.Context, id string, err error, w io.Writer) (int, bool) {
	msg := err.Error()
	i := strings.Index(msg, ociExecFailed)
	if i < 0 {
		return 0, false
	}
	msg = msg[i:]
	_, _ = io.WriteString(w, msg+"\n")
	code := 126
	if ins, ierr := d.cli.ExecInspect(ctx, id, client.ExecInspectOptions{}); ierr == nil && !ins.Running && ins.ExitCode != 0 {
		code = ins.ExitCode
	}
	return startExitCode(code, msg), true
}

// startExitCode maps the engine's 126 for "cannot start" to the shell's 127
// when the executable does not exist.
func startExitCode(code int, msg string) int {
	if code == 126 && (strings.Contains(msg, "executable file not found") || strings.Contains(msg, "no such file or directory")) {
		return 127
	}
	return code
}

// waitExec polls the exec until the engine reports it ended. The output
// stream has ended by then, so this rarely takes more than one call.
func (d *Driver) waitExec(ctx context.Context, id string) (int, error) {
	delay := time.Millisecond
	for {
		ins, err := d.cli.ExecInspect(ctx, id, client.ExecInspectOptions{})
		if err != nil {
			return 0, fmt.Errorf("inspect exec: %w", err)
		}
		if !ins.Running {
			return ins.ExitCode, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// followResize applies terminal sizes until ctx ends or ch closes. The first
// size is retried for a moment: the engine refuses a resize before the
// process runs.
func (d *Driver) followResize(ctx context.Context, id string, first *sandbox.TermSize, ch <-chan sandbox.TermSize) {
	resize := func(sz sandbox.TermSize) error {
		_, err := d.cli.ExecResize(ctx, id, client.ExecResizeOptions{Height: uint(sz.Rows), Width: uint(sz.Cols)})
		return err
	}
	pending := first
	for {
		if pending != nil {
			var err error
			for attempt := 1; attempt <= 10; attempt++ {
				if err = resize(*pending); err == nil || ctx.Err() != nil {
					break
				}
				t := time.NewTimer(time.Duration(attempt) * 10 * time.Millisecond)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			if err != nil && ctx.Err() == nil {
				d.log.Debug().Err(err).Msg("exec resize")
			}
			pending = nil
		}
		select {
		case <-ctx.Done():
			return
		case sz, ok := <-ch:
			if !ok {
				return
			}
			pending = &sz
		}
	}
}

// startErrSniffer passes output through to w, except when it begins with the
// engine's "OCI runtime exec failed" message (which the engine writes on the
// stdout stream): that goes to divert, and is kept in msg.
type startErrSniffer struct {
	w, divert io.Writer
	buf       []byte
	decided   bool
	diverted  bool
	msg       bytes.Buffer
}

func (s *startErrSniffer) Write(p []byte) (int, error) {
	if s.decided {
		if s.diverted {
			if s.msg.Len() < 4096 {
				s.msg.Write(p)
			}
			return s.divert.Write(p)
		}
		return s.w.Write(p)
	}
	s.buf = append(s.buf, p...)
	n := min(len(s.buf), len(ociExecFailed))
	if string(s.buf[:n]) != ociExecFailed[:n] {
		s.decided = true
		buf := s.buf
		s.buf = nil
		if _, err := s.w.Write(buf); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if len(s.buf) >= len(ociExecFailed) {
		s.decided, s.diverted = true, true
		buf := s.buf
		s.buf = nil
		s.msg.Write(buf)
		if _, err := s.divert.Write(buf); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flush writes out bytes held back while deciding.
func (s *startErrSniffer) flush() {
	if !s.decided && len(s.buf) > 0 {
		_, _ = s.w.Write(s.buf)
		s.buf = nil
	}
	s.decided = true
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
