//go:build linux

package vminit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
	"golang.org/x/sys/unix"
)

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badInterp := filepath.Join(dir, "bad-interpreter")
	if err := os.WriteFile(badInterp, []byte("#!/no/such/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string // after "vm-exec --run-dir R"
		want       int
		wantStderr string // substring
		wantStdout string // exact, when set
	}{
		{"zero", []string{"--", "sh", "-c", "exit 0"}, 0, "", ""},
		{"three", []string{"--", "sh", "-c", "exit 3"}, 3, "", ""},
		{"missing", []string{"--", "no-such-command-x9"}, vminit.ExitNotFound, "agents-sandbox: no-such-command-x9: command not found", ""},
		{"missing path", []string{"--", "/no/such/file"}, vminit.ExitNotFound, "No such file or directory", ""},
		{"not executable", []string{"--", notExec}, vminit.ExitCannotRun, "Permission denied", ""},
		{"directory", []string{"--", dir}, vminit.ExitCannotRun, "Is a directory", ""},
		{"bad interpreter", []string{"--", badInterp}, vminit.ExitCannotRun, "bad interpreter", ""},
		{"timeout", []string{"--timeout", "300ms", "--", "sleep", "1000"}, vminit.ExitTimeout, "agents-sandbox: timed out after 300ms", ""},
		{"timeout ignoring SIGTERM", []string{"--timeout", "300ms", "--kill-after", "200ms", "--", "sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"}, vminit.ExitTimeout, "timed out", ""},
		{"SIGINT", []string{"--", "sh", "-c", "kill -INT $$"}, 130, "", ""},
		{"SIGTERM", []string{"--", "sh", "-c", "kill -TERM $$"}, 143, "", ""},
		{"SIGKILL", []string{"--", "sh", "-c", "kill -KILL $$"}, 137, "", ""},
		{"no command", []string{"--"}, vminit.ExitWrapperError, "no command", ""},
		{"bad id", []string{"--id", "../x", "--", "true"}, vminit.ExitWrapperError, "invalid session id", ""},
		{"bad workdir", []string{"--workdir", filepath.Join(dir, "nope"), "--", "true"}, vminit.ExitWrapperError, "no such directory", ""},
		{"bad env", []string{"--env", "NOVALUE", "--", "true"}, vminit.ExitWrapperError, "KEY=VALUE", ""},
		{"workdir and env", []string{"--workdir", dir, "--env", "VMINIT_X=a b", "--", "sh", "-c", `echo "$PWD:$VMINIT_X"`}, 0, "", dir + ":a b\n"},
		{"env PATH is used for lookup", []string{"--env", "PATH=" + dir, "--", "not-executable"}, vminit.ExitNotFound, "command not found", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"vm-exec", "--run-dir", runDir(t)}, tt.args...)
			code, stdout, stderr := run(t, nil, args...)
			if code != tt.want {
				t.Errorf("exit code %d, want %d; stderr: %q", code, tt.want, stderr)
			}
			if !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.wantStderr)
			}
			if tt.wantStdout != "" && stdout != tt.wantStdout {
				t.Errorf("stdout %q, want %q", stdout, tt.wantStdout)
			}
		})
	}
}

// TestExecForwardsSignals signals the wrapper and expects the command to die
// of it.
func TestExecForwardsSignals(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		sig  syscall.Signal
		want int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}, {syscall.SIGHUP, 129}} {
		t.Run(tt.sig.String(), func(t *testing.T) {
			t.Parallel()
			rd := runDir(t)
			p := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "sig", "--", "sleep", "1000")
			s := waitSession(t, rd, "sig")
			if err := p.cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != tt.want {
				t.Errorf("exit code %d, want %d", code, tt.want)
			}
			if g := inGroup(t, s.PGID); len(g) != 0 {
				t.Errorf("processes left in group %d: %+v", s.PGID, g)
			}
		})
	}
}

func TestExecRegistersSession(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	p := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "reg", "--daemon", "--", "sleep", "1000")
	s := waitSession(t, rd, "reg")
	if s.ID != "reg" || s.PID != p.cmd.Process.Pid || !s.Daemon || s.StartTicks == 0 || s.ChildStartTicks == 0 {
		t.Errorf("session = %+v, want id reg, wrapper pid %d, daemon, start times", s, p.cmd.Process.Pid)
	}
	child, err := vminit.ReadProcStat(s.PGID)
	if err != nil {
		t.Fatalf("the command (pid %d): %v", s.PGID, err)
	}
	if child.PPID != p.cmd.Process.Pid || child.PGRP != s.PGID || child.StartTicks != s.ChildStartTicks {
		t.Errorf("command %+v: want parent %d, its own group, start %d", child, p.cmd.Process.Pid, s.ChildStartTicks)
	}
	if got := strings.Join(s.Cmd, " "); got != "sleep 1000" {
		t.Errorf("cmd %q", got)
	}
	fi, err := os.Stat(vminit.SessionsDir(rd))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("sessions dir mode %v, want sticky 0777", fi.Mode())
	}

	// A second session with the same id is refused while the first lives.
	code, _, stderr := run(t, nil, "vm-exec", "--run-dir", rd, "--id", "reg", "--", "true")
	if code != vminit.ExitWrapperError || !strings.Contains(stderr, "already running") {
		t.Errorf("duplicate id: exit %d, stderr %q; want %d, already running", code, stderr, vminit.ExitWrapperError)
	}

	if err := vminit.Kill(rd, "reg", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
	if _, err := os.Stat(filepath.Join(vminit.SessionsDir(rd), "reg.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("session file after the end: %v, want it gone", err)
	}
}

// TestExecTakesOverStaleSession: the file of a dead wrapper does not block
// its id.
func TestExecTakesOverStaleSession(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	writeSession(t, rd, vminit.Session{ID: "stale", PID: deadPID(t), StartTicks: 1, PGID: 1234567})
	code, stdout, stderr := run(t, nil, "vm-exec", "--run-dir", rd, "--id", "stale", "--", "echo", "ok")
	if code != 0 || stdout != "ok\n" {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0, ok", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(vminit.SessionsDir(rd), "stale.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("session file after the end: %v, want it gone", err)
	}
}

func writeSession(t *testing.T, rd string, s vminit.Session) {
	t.Helper()
	if err := os.MkdirAll(vminit.SessionsDir(rd), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vminit.SessionsDir(rd), s.ID+".pid"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestExecTimeoutKillsEverything: a timeout kills the command's whole process
// group and the descendants that left it.
func TestExecTimeoutKillsEverything(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	escapedFile := filepath.Join(t.TempDir(), "escaped")
	script := `setsid sh -c 'echo $$ > ` + escapedFile + `; exec sleep 1000' >/dev/null 2>&1 &
sleep 1000 & sleep 1000 >/dev/null 2>&1 &
sleep 1000`
	p := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "to", "--timeout", "2s", "--", "sh", "-c", script)
	s := waitSession(t, rd, "to")
	escaped := waitFileInt(t, escapedFile)
	killAtCleanup(t, escaped)
	if st, err := vminit.ReadProcStat(escaped); err != nil || st.PGRP == s.PGID {
		t.Fatalf("the escaped process %d: %+v, %v; want it alive outside group %d", escaped, st, err, s.PGID)
	}
	if code := p.wait(t); code != vminit.ExitTimeout {
		t.Errorf("exit code %d, want %d", code, vminit.ExitTimeout)
	}
	if !strings.Contains(p.stderr.String(), "timed out after 2s") {
		t.Errorf("stderr %q lacks the timeout note", p.stderr)
	}
	if g := inGroup(t, s.PGID); len(g) != 0 {
		t.Errorf("processes left in group %d (zombies included): %+v", s.PGID, g)
	}
	if st := procState(escaped); st != 0 {
		t.Errorf("escaped process %d still there, state %c", escaped, st)
	}
}

// TestExecLeftovers: a finished command's background processes are killed,
// unless the session is a daemon.
func TestExecLeftovers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		daemon bool
	}{{"killed", false}, {"daemon keeps them", true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rd := runDir(t)
			bg := filepath.Join(t.TempDir(), "bg")
			args := []string{"vm-exec", "--run-dir", rd}
			if tt.daemon {
				args = append(args, "--daemon")
			}
			args = append(args, "--", "bash", "-c", `sleep 1000 >/dev/null 2>&1 & echo $! > `+bg+`
setsid sh -c 'echo $$ >> `+bg+`; exec sleep 1000' >/dev/null 2>&1 &
while [ $(wc -l < `+bg+`) -lt 2 ]; do sleep 0.01; done`)
			code, _, stderr := run(t, nil, args...)
			if code != 0 {
				t.Fatalf("exit code %d; stderr %q", code, stderr)
			}
			data, err := os.ReadFile(bg)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range strings.Fields(string(data)) {
				pid := atoi(t, f)
				killAtCleanup(t, pid)
				if got := running(pid); got != tt.daemon {
					t.Errorf("background process %d running = %v after the command ended, want %v", pid, got, tt.daemon)
				}
			}
		})
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestExecOrphansReaped: 100 short-lived orphans are reaped by the wrapper
// (a subreaper) and none is left when it returns.
func TestExecOrphansReaped(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	p := start(t, nil, "vm-exec", "--run-dir", rd, "--", "sh", "-c", `for i in $(seq 100); do (sleep 0.1 &) ; done`)
	wrapper := p.cmd.Process.Pid
	var zombies int
	waitFor(t, "the wrapper to end", func() bool {
		if !p.exited() {
			for _, c := range childrenOf(t, wrapper) {
				if c.State == 'Z' {
					zombies++
				}
			}
		}
		return p.exited()
	})
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d; stderr %q", code, p.stderr)
	}
	t.Logf("zombie sightings under the wrapper while it ran: %d (reaped on SIGCHLD)", zombies)
}

func TestExecBinarySafe(t *testing.T) {
	t.Parallel()
	var all bytes.Buffer
	for range 512 {
		for b := range 256 {
			all.WriteByte(byte(b))
		}
	}
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, all.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		script string
		stdout bool
	}{{"stdout", "cat", true}, {"stderr", "cat >&2", false}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := os.Open(in)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			p := start(t, f, "vm-exec", "--run-dir", runDir(t), "--", "sh", "-c", tt.script)
			if code := p.wait(t); code != 0 {
				t.Fatalf("exit code %d", code)
			}
			got, other := p.stdout.Bytes(), p.stderr.Bytes()
			if !tt.stdout {
				got, other = other, got
			}
			if !bytes.Equal(got, all.Bytes()) {
				t.Errorf("%s: %d bytes differ from the %d written", tt.name, len(got), all.Len())
			}
			if len(other) != 0 {
				t.Errorf("the other stream got %d bytes", len(other))
			}
		})
	}
}

func TestKill(t *testing.T) {
	t.Parallel()
	t.Run("unknown ids", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		for _, id := range []string{"nope", "../etc/passwd", ""} {
			if err := vminit.Kill(rd, id, syscall.SIGTERM); !errors.Is(err, vminit.ErrNoSession) {
				t.Errorf("Kill(%q) = %v, want ErrNoSession", id, err)
			}
		}
		writeSession(t, rd, vminit.Session{ID: "dead", PID: deadPID(t), StartTicks: 1, PGID: deadPID(t), ChildStartTicks: 1})
		if err := vminit.Kill(rd, "dead", syscall.SIGTERM); !errors.Is(err, vminit.ErrNoSession) {
			t.Errorf("Kill(dead) = %v, want ErrNoSession", err)
		}
	})
	for _, tt := range []struct {
		name   string
		sig    syscall.Signal
		script string
		want   int
	}{
		{"TERM", syscall.SIGTERM, "sleep 1000", 143},
		{"INT", syscall.SIGINT, "sleep 1000", 130},
		{"KILL a TERM-ignoring command", syscall.SIGKILL, "trap '' TERM; sleep 1000; exit 0", 137},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rd := runDir(t)
			p := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "k", "--", "sh", "-c", tt.script)
			s := waitSession(t, rd, "k")
			if err := vminit.Kill(rd, "k", tt.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != tt.want {
				t.Errorf("exit code %d, want %d", code, tt.want)
			}
			if g := inGroup(t, s.PGID); len(g) != 0 {
				t.Errorf("processes left in group %d: %+v", s.PGID, g)
			}
			if err := vminit.Kill(rd, "k", tt.sig); !errors.Is(err, vminit.ErrNoSession) {
				t.Errorf("Kill after the end = %v, want ErrNoSession", err)
			}
		})
	}
	t.Run("daemon and its escaped child", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		escFile := filepath.Join(t.TempDir(), "esc")
		p := start(t, nil, "vm-exec", "--run-dir", rd, "--daemon", "--id", "d", "--", "sh", "-c",
			`setsid sh -c 'echo $$ > `+escFile+`; exec sleep 1000' >/dev/null 2>&1 & sleep 1000`)
		waitSession(t, rd, "d")
		esc := waitFileInt(t, escFile)
		killAtCleanup(t, esc)
		waitFor(t, "the escaped process to run sleep", func() bool {
			data, err := os.ReadFile("/proc/" + strconv.Itoa(esc) + "/comm")
			return err == nil && string(data) == "sleep\n"
		})
		if err := vminit.Kill(rd, "d", syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != 143 {
			t.Errorf("exit code %d, want 143", code)
		}
		waitFor(t, "the escaped process to die", func() bool { return !running(esc) })
	})
	t.Run("wrapper gone, command alive", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		p := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "orphan", "--", "sleep", "1000")
		s := waitSession(t, rd, "orphan")
		killAtCleanup(t, s.PGID)
		if err := p.cmd.Process.Kill(); err != nil { // the wrapper only
			t.Fatal(err)
		}
		<-p.done
		if !running(s.PGID) {
			t.Fatal("the command died with its wrapper")
		}
		if err := vminit.Kill(rd, "orphan", syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the command to die", func() bool { return !running(s.PGID) })
	})
}

// TestExecTerminal: on a terminal the command gets the foreground process
// group, so it can read the terminal (a background group would be stopped
// by SIGTTIN).
func TestExecTerminal(t *testing.T) {
	t.Parallel()
	master, slave := openPTY(t)
	p := &proc{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "vm-exec", "--run-dir", runDir(t), "--", "sh", "-c", `read line; echo "got:$line"`)
	p.cmd.Env = append(os.Environ(), helperEnv+"=1")
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = slave, slave, slave
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	startCmd(t, p)
	slave.Close()

	if _, err := master.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	buf := make([]byte, 1024)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for !bytes.Contains(out.Bytes(), []byte("got:hello")) {
		if err := master.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		n, err := master.Read(buf)
		out.Write(buf[:n])
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read terminal: %v; so far %q", err, out.String())
		}
		if ctx.Err() != nil {
			t.Fatalf("no answer from the command on the terminal; so far %q", out.String())
		}
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d; terminal output %q", code, out.String())
	}
}

// openPTY opens a pseudo-terminal pair (Linux /dev/ptmx).
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	raw, err := master.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n uint32
	var ioErr error
	if err := raw.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
			return
		}
		n, ioErr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
	}); err != nil || ioErr != nil {
		t.Fatalf("unlock pty: %v %v", err, ioErr)
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// TestExecUnusableRunDir: when the session cannot be registered (then Init
// cannot see sessions and its watchdog is off), the command still runs.
func TestExecUnusableRunDir(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, nil, "vm-exec", "--run-dir", filepath.Join(file, "run"), "--", "sh", "-c", "echo ran; exit 6")
	if code != 6 || stdout != "ran\n" || stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want 6, ran, nothing", code, stdout, stderr)
	}
}
