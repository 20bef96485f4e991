package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// exec runs req in vm and returns stdout, stderr and the exit code; an error
// from Exec fails t.
func (s *suite) exec(t *testing.T, vm string, req sandbox.ExecRequest) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	req.Stdout, req.Stderr = &out, &errOut
	res, err := s.rt.Exec(s.ctx(t), vm, req)
	if err != nil {
		t.Fatalf("Exec %q in %s: %v", req.Cmd, vm, err)
	}
	return out.String(), errOut.String(), res.ExitCode
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for delay := 5 * time.Millisecond; !cond(); delay = min(2*delay, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(delay)
	}
}

func (s *suite) testExec(t *testing.T) {
	vm := s.name("exec")
	s.startedVM(t, sandbox.VMSpec{Name: vm})

	t.Run("StdoutStderrApartAndExitCodes", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			cmd              []string
			wantOut, wantErr string
			wantCode         int
			errContains      string
		}{
			{cmd: []string{"true"}, wantCode: 0},
			{cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, wantOut: "out\n", wantErr: "err\n", wantCode: 3},
			{cmd: []string{"sh", "-c", "printf 'a\\000b\\377'; exit 0"}, wantOut: "a\x00b\xff", wantCode: 0},
			{cmd: []string{"sh", "-c", "ast-no-such-command"}, wantCode: 127, errContains: "not found"},
			{cmd: []string{"ast-no-such-command"}, wantCode: 127, errContains: "ast-no-such-command"},
			{cmd: []string{"/no/such/file"}, wantCode: 127, errContains: "/no/such/file"},
			{cmd: []string{"/etc/passwd"}, wantCode: 126, errContains: "permission denied"},
		} {
			out, errOut, code := s.exec(t, vm, sandbox.ExecRequest{Cmd: tc.cmd})
			if code != tc.wantCode {
				t.Errorf("%q: exit %d, want %d (stdout %q, stderr %q)", tc.cmd, code, tc.wantCode, out, errOut)
			}
			if out != tc.wantOut {
				t.Errorf("%q: stdout %q, want %q", tc.cmd, out, tc.wantOut)
			}
			if tc.errContains != "" {
				if !strings.Contains(errOut, tc.errContains) {
					t.Errorf("%q: stderr %q does not contain %q", tc.cmd, errOut, tc.errContains)
				}
			} else if errOut != tc.wantErr {
				t.Errorf("%q: stderr %q, want %q", tc.cmd, errOut, tc.wantErr)
			}
		}
	})

	t.Run("UserWorkDirEnv", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := s.exec(t, vm, sandbox.ExecRequest{
			Cmd:  []string{"sh", "-c", `id -u; pwd; echo "$AST_X"`},
			User: "65534", WorkDir: "/var/tmp", Env: []string{"AST_X=from exec"},
		})
		if want := "65534\n/var/tmp\nfrom exec\n"; code != 0 || out != want {
			t.Errorf("got %q (exit %d, stderr %q), want %q", out, code, errOut, want)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		t.Parallel()
		out, _, code := s.exec(t, vm, sandbox.ExecRequest{Cmd: []string{"cat"}, Stdin: strings.NewReader("piped in\n")})
		if code != 0 || out != "piped in\n" {
			t.Errorf("cat with stdin: %q (exit %d)", out, code)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		out, _, code = s.exec(t, vm, sandbox.ExecRequest{Cmd: []string{"wc", "-c"}, Stdin: bytes.NewReader(big)})
		if code != 0 || strings.TrimSpace(out) != "1048576" {
			t.Errorf("wc -c of 1 MiB on stdin: %q (exit %d)", out, code)
		}
		// No stdin: the command sees EOF at once.
		out, _, code = s.exec(t, vm, sandbox.ExecRequest{Cmd: []string{"wc", "-c"}})
		if code != 0 || strings.TrimSpace(out) != "0" {
			t.Errorf("wc -c without stdin: %q (exit %d)", out, code)
		}
	})

	t.Run("TTY", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := s.exec(t, vm, sandbox.ExecRequest{
			Cmd: []string{"sh", "-c", "tty; echo out; echo err >&2; exit 5"}, TTY: true,
		})
		if code != 5 {
			t.Errorf("TTY exec: exit %d, want 5", code)
		}
		if errOut != "" || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "out\r\n") || !strings.Contains(out, "err\r\n") {
			t.Errorf("TTY exec: stdout %q, stderr %q; want a pty, both lines on stdout with CRLF", out, errOut)
		}

		// The first size is applied as soon as the command starts.
		resize := make(chan sandbox.TermSize, 1)
		resize <- sandbox.TermSize{Rows: 33, Cols: 101}
		script := `i=0; while [ "$(stty size 2>/dev/null)" != "33 101" ] && [ $i -lt 3000 ]; do i=$((i+1)); done; stty size`
		out, _, code = s.exec(t, vm, sandbox.ExecRequest{Cmd: []string{"sh", "-c", script}, TTY: true, Resize: resize})
		if code != 0 || strings.TrimSpace(out) != "33 101" {
			t.Errorf("TTY size after a resize: %q (exit %d), want \"33 101\"", out, code)
		}
	})

	t.Run("Detach", func(t *testing.T) {
		t.Parallel()
		ctx := s.ctx(t)
		res, err := s.rt.Exec(ctx, vm, sandbox.ExecRequest{
			Cmd: []string{"sh", "-c", "echo detached > /tmp/detach.out"}, Detach: true,
		})
		if err != nil || res.ExitCode != -1 {
			t.Fatalf("detached Exec = %+v, %v; want exit -1", res, err)
		}
		waitFor(t, 10*time.Second, "the detached command's file", func() bool {
			out, _, code := s.exec(t, vm, sandbox.ExecRequest{Cmd: []string{"cat", "/tmp/detach.out"}})
			return code == 0 && out == "detached\n"
		})
		var errOut bytes.Buffer
		res, err = s.rt.Exec(ctx, vm, sandbox.ExecRequest{Cmd: []string{"ast-no-such-command"}, Detach: true, Stderr: &errOut})
		if err != nil || res.ExitCode != 127 {
			t.Errorf("detached missing command = %+v, %v; want exit 127 and no error", res, err)
		}
	})

	t.Run("CancelClosesPromptly", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(s.ctx(t))
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := s.rt.Exec(ctx, vm, sandbox.ExecRequest{
				Cmd: []string{"sh", "-c", "echo $$ > /tmp/cancel.pid; exec sleep 1000"}, Stdout: new(bytes.Buffer),
			})
			done <- err
		}()
		t.Cleanup(func() {
			cctx, ccancel := cleanupCtx()
			defer ccancel()
			_, _ = s.rt.Exec(cctx, vm, sandbox.ExecRequest{Cmd: []string{"sh", "-c", "kill $(cat /tmp/cancel.pid)"}})
		})
		waitFor(t, 10*time.Second, "the command to start", func() bool {
			_, _, code := s.exec(t, vm, sandbox.ExecRequest{Cmd: []string{"test", "-s", "/tmp/cancel.pid"}})
			return code == 0
		})
		cancel()
		start := time.Now()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled Exec: err = %v, want context.Canceled", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("cancelled Exec returned after %v", d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("cancelled Exec did not return within 5s")
		}
	})

	t.Run("NotRunning", func(t *testing.T) {
		t.Parallel()
		stopped := s.createVM(t, sandbox.VMSpec{Name: s.name("exec-created")})
		_, err := s.rt.Exec(s.ctx(t), stopped.Name, sandbox.ExecRequest{Cmd: []string{"true"}})
		if !errors.Is(err, sandbox.ErrConflict) {
			t.Errorf("Exec in a created, not started VM: err = %v, want ErrConflict", err)
		}
	})
}
