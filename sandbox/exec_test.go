package sandbox_test

// End-to-end tests of Manager.Exec and headless Attach (issue 3) in one
// shared VM of the shell agent. Helpers are in lifecycle_test.go.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

func TestExec(t *testing.T) {
	t.Parallel()
	e := newLC(t, lcOptions{})
	dir := e.checkout(t, "exec", lcShellConfig, nil)
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := e.open(t, dir, nil)
	e.create(t, p, sandbox.CreateOptions{})
	run := func(t *testing.T, o sandbox.ExecOptions) sandbox.CommandResult {
		t.Helper()
		return e.run(t, p, o)
	}
	sh := func(script string) []string { return []string{"sh", "-c", script} }

	// The subtests run one after another: some look at every process in
	// the VM.
	t.Run("exit codes and streams", func(t *testing.T) {
		for _, tt := range []struct {
			name           string
			cmd            []string
			code           int
			stdout, stderr string
		}{
			{"success", sh("echo out"), 0, "out\n", ""},
			{"exit 3", sh("exit 3"), 3, "", ""},
			{"stderr apart", sh("echo out; echo err >&2; echo out2; exit 5"), 5, "out\nout2\n", "err\n"},
			{"signal", sh("kill -TERM $$"), 143, "", ""},
		} {
			res := run(t, sandbox.ExecOptions{Cmd: tt.cmd})
			if res.ExitCode != tt.code || res.Stdout.Text != tt.stdout || res.Stderr.Text != tt.stderr || res.TimedOut || res.Cancelled {
				t.Errorf("%s: got exit %d stdout %q stderr %q timed out %v cancelled %v; want exit %d stdout %q stderr %q",
					tt.name, res.ExitCode, res.Stdout.Text, res.Stderr.Text, res.TimedOut, res.Cancelled, tt.code, tt.stdout, tt.stderr)
			}
		}
	})

	t.Run("missing command", func(t *testing.T) {
		for _, cmd := range [][]string{{"no-such-command-here"}, {"/no/such/path"}} {
			res := run(t, sandbox.ExecOptions{Cmd: cmd})
			if res.ExitCode != 127 || !strings.Contains(res.Stderr.Text, cmd[0]) {
				t.Errorf("%q: exit %d, stderr %q; want 127 and a message naming it", cmd, res.ExitCode, res.Stderr.Text)
			}
		}
		if res := run(t, sandbox.ExecOptions{Cmd: []string{"/etc/hostname"}}); res.ExitCode != 126 {
			t.Errorf("a file that is not executable: exit %d, want 126 (stderr %q)", res.ExitCode, res.Stderr.Text)
		}
	})

	t.Run("workdir env stdin user", func(t *testing.T) {
		sub, err := e.m.Open(sandbox.OpenOptions{Dir: filepath.Join(dir, "a", "b"), Trust: true})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.m.Exec(lcCtx(t), sub, sandbox.ExecOptions{Cmd: sh(`pwd; echo "$X"; cat; id -un`), Env: map[string]string{"X": "x y"}, Stdin: strings.NewReader("from stdin\n")})
		if err != nil {
			t.Fatal(err)
		}
		wantUser := "dev"
		if e.m.RunAsRoot {
			wantUser = "root"
		}
		if want := "/workspace/a/b\nx y\nfrom stdin\n" + wantUser + "\n"; res.Stdout.Text != want {
			t.Errorf("got %q, want %q", res.Stdout.Text, want)
		}
		if got := e.shAs(t, p, "dev", "id -un; echo $HOME"); got != "dev\n/home/dev\n" {
			t.Errorf("as dev: %q", got)
		}
	})

	t.Run("output cap", func(t *testing.T) {
		var streamed bytes.Buffer
		res := run(t, sandbox.ExecOptions{Cmd: sh("head -c 5000 /dev/zero | tr '\\0' a; head -c 300 /dev/zero | tr '\\0' b >&2"), OutputCap: 1000, Stdout: &streamed})
		o := res.Stdout
		if !o.Truncated || o.Bytes != 5000 || o.Kept != 1000 || o.Text != strings.Repeat("a", 1000) || o.Encoding != "utf-8" {
			t.Errorf("stdout: truncated %v, bytes %d, kept %d, %d chars of text, encoding %s; want true, 5000, 1000, 1000, utf-8",
				o.Truncated, o.Bytes, o.Kept, len(o.Text), o.Encoding)
		}
		if streamed.Len() != 5000 {
			t.Errorf("the Stdout writer got %d bytes, want all 5000", streamed.Len())
		}
		if s := res.Stderr; s.Truncated || s.Bytes != 300 || s.Kept != 300 {
			t.Errorf("stderr: %+v", s)
		}
		// A cut inside a multi-byte character is still text.
		res = run(t, sandbox.ExecOptions{Cmd: sh("printf 'aé%.0s' $(seq 100)"), OutputCap: 2})
		if o := res.Stdout; o.Encoding != "utf-8" || o.Text != "a" || o.Kept != 1 || o.Bytes != 300 || !o.Truncated {
			t.Errorf("cut in a rune: %+v", o)
		}
	})

	t.Run("binary output", func(t *testing.T) {
		want := []byte{0xff, 0xfe, 'a', 0x00, 0x80, '\n', 0xc3}
		res := run(t, sandbox.ExecOptions{Cmd: sh(`printf '\377\376a\000\200\n\303'; printf 'ok\n' >&2`)})
		if res.Stdout.Encoding != "base64" {
			t.Fatalf("stdout encoding %q, want base64 (text %q)", res.Stdout.Encoding, res.Stdout.Text)
		}
		got, err := base64.StdEncoding.DecodeString(res.Stdout.Text)
		if err != nil || !bytes.Equal(got, want) || res.Stdout.Bytes != int64(len(want)) {
			t.Errorf("decoded %q (%v), bytes %d; want %q", got, err, res.Stdout.Bytes, want)
		}
		if res.Stderr.Encoding != "utf-8" || res.Stderr.Text != "ok\n" {
			t.Errorf("stderr: %+v", res.Stderr)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		res := run(t, sandbox.ExecOptions{Cmd: sh("echo started; sleep 1000; echo never"), Timeout: 2 * time.Second})
		took := time.Since(start)
		if res.ExitCode != 124 || !res.TimedOut || res.Cancelled {
			t.Errorf("exit %d, timed out %v, cancelled %v; want 124, true, false", res.ExitCode, res.TimedOut, res.Cancelled)
		}
		if took < 2*time.Second || took > 10*time.Second {
			t.Errorf("took %s, want about 2 s", took)
		}
		t.Logf("timeout of 2 s returned after %s", took.Round(10*time.Millisecond))
		e.noProcess(t, p, "sleep 1000")
		// Processes that left the group (setsid) go too.
		res = run(t, sandbox.ExecOptions{Cmd: sh("setsid sleep 1004 >/dev/null 2>&1 & sleep 1000"), Timeout: 1 * time.Second})
		if res.ExitCode != 124 {
			t.Errorf("setsid case: exit %d, want 124", res.ExitCode)
		}
		e.noProcess(t, p, "sleep 1000")
		e.noProcess(t, p, "sleep 1004")
		if res := run(t, sandbox.ExecOptions{Cmd: sh("echo next")}); res.ExitCode != 0 || res.Stdout.Text != "next\n" {
			t.Errorf("the exec after the timeout: %+v", res)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(lcCtx(t))
		defer cancel()
		started := make(chan struct{})
		w := &lcNotifyWriter{match: "started", ch: started}
		type out struct {
			res sandbox.CommandResult
			err error
		}
		done := make(chan out, 1)
		go func() {
			r, err := e.m.Exec(ctx, p, sandbox.ExecOptions{Cmd: sh("echo started; sleep 1001 & sleep 1002; wait"), Stdout: w})
			done <- out{r, err}
		}()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the command did not start")
		}
		cancel()
		var o out
		select {
		case o = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Exec did not return after its context was cancelled")
		}
		if o.err != nil || !o.res.Cancelled || o.res.TimedOut || o.res.ExitCode != 130 {
			t.Errorf("cancelled Exec: %+v, %v; want Cancelled, exit 130", o.res, o.err)
		}
		e.noProcess(t, p, "sleep 1001")
		e.noProcess(t, p, "sleep 1002")
	})

	t.Run("orphans and zombies", func(t *testing.T) {
		// 100 background processes whose parents exit at once: orphans the
		// VM's init (or the exec wrapper) must reap.
		res := run(t, sandbox.ExecOptions{Cmd: sh(`for i in $(seq 100); do sh -c 'sleep 0.3 >/dev/null 2>&1 &'; done; echo spawned`)})
		if res.ExitCode != 0 || res.Stdout.Text != "spawned\n" {
			t.Fatalf("spawning: %+v", res)
		}
		lcWaitFor(t, 30*time.Second, "no sleep 0.3 and no zombie left", func() (bool, string) {
			var left []string
			for _, pr := range e.procs(t, p) {
				if pr.State == 'Z' || pr.Cmd == "sleep 0.3" {
					left = append(left, fmt.Sprintf("%d %c %q", pr.PID, pr.State, pr.Cmd))
				}
			}
			return len(left) == 0, strings.Join(left, ", ")
		})
		// Orphans that outlive a short command are killed with it.
		res = run(t, sandbox.ExecOptions{Cmd: sh(`for i in $(seq 20); do sh -c 'sleep 1003 >/dev/null 2>&1 &'; done; setsid sleep 1005 >/dev/null 2>&1 &`)})
		if res.ExitCode != 0 {
			t.Fatalf("spawning long orphans: %+v", res)
		}
		e.noProcess(t, p, "sleep 1003")
		e.noProcess(t, p, "sleep 1005")
		for _, pr := range e.procs(t, p) {
			if pr.State == 'Z' {
				t.Errorf("zombie %d (%s)", pr.PID, pr.Cmd)
			}
		}
	})

	t.Run("terminal", func(t *testing.T) {
		resize := make(chan sandbox.TermSize, 1)
		resize <- sandbox.TermSize{Rows: 41, Cols: 113}
		var out bytes.Buffer
		res := run(t, sandbox.ExecOptions{Cmd: sh("tty; stty size; echo err >&2; exit 6"), TTY: true, Resize: resize, Stdout: &out})
		got := strings.ReplaceAll(res.Stdout.Text, "\r\n", "\n")
		if res.ExitCode != 6 || !strings.HasPrefix(got, "/dev/pts/") || !strings.Contains(got, "\n41 113\nerr\n") {
			t.Errorf("with a terminal: exit %d, output %q; want 6, a pts, the size 41 113 and stderr on the terminal", res.ExitCode, res.Stdout.Text)
		}
	})

	t.Run("headless attach", func(t *testing.T) {
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{"echo hi"}, "hi\n"},
			{[]string{"echo", "hi", "there"}, "hi there\n"},
			{[]string{"echo $HOME; exit 4"}, "/home/dev\n"},
		} {
			res, err := e.m.Attach(lcCtx(t), p, sandbox.AttachOptions{Headless: true, Args: tt.args})
			if err != nil {
				t.Fatal(err)
			}
			wantCode := 0
			if strings.Contains(tt.args[0], "exit 4") {
				wantCode = 4
			}
			if res.Stdout.Text != tt.want || res.ExitCode != wantCode {
				t.Errorf("headless %q: exit %d, stdout %q, stderr %q; want %d, %q", tt.args, res.ExitCode, res.Stdout.Text, res.Stderr.Text, wantCode, tt.want)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		if _, err := e.m.Exec(lcCtx(t), p, sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("empty command: %v, want ErrInvalid", err)
		}
		other, err := e.m.Open(sandbox.OpenOptions{Dir: dir, Agent: "codex", Trust: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.Exec(lcCtx(t), other, sandbox.ExecOptions{Cmd: []string{"true"}}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("exec in a VM never created: %v, want ErrNotFound", err)
		}
	})
}

// noProcess waits until no process in the VM has the command line cmd.
func (e *lcEnv) noProcess(t *testing.T, p *sandbox.Project, cmd string) {
	t.Helper()
	lcWaitFor(t, 15*time.Second, "no "+cmd+" left in the VM", func() (bool, string) {
		var pids []string
		for _, pr := range e.procs(t, p) {
			if pr.Cmd == cmd {
				pids = append(pids, fmt.Sprintf("%d (%c)", pr.PID, pr.State))
			}
		}
		return len(pids) == 0, strings.Join(pids, ", ")
	})
}

// lcNotifyWriter closes ch once the output contains match.
type lcNotifyWriter struct {
	buf   bytes.Buffer
	match string
	ch    chan struct{}
	done  bool
}

func (w *lcNotifyWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.match) {
		w.done = true
		close(w.ch)
	}
	return len(p), nil
}
