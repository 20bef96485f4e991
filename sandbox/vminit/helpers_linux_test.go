//go:build linux

package vminit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit/internal/vmcli"
)

// helperEnv makes the test binary act as the vmcli command line, so the tests
// run Init and Exec as real processes (they own their process's signals and
// children).
const helperEnv = "VMINIT_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(vmcli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// waitLimit bounds every wait in these tests; the machine may be loaded.
const waitLimit = 60 * time.Second

// lockedBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

func (l *lockedBuffer) String() string { return string(l.Bytes()) }

// proc is the test binary running one vmcli subcommand.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	done           chan struct{}
	err            error // from Wait, valid after done
}

// start runs `<test binary> args...` in its own process group with stdin
// (nil: /dev/null). The process is killed at cleanup if still running.
func start(t *testing.T, stdin io.Reader, args ...string) *proc {
	t.Helper()
	p := &proc{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(os.Environ(), helperEnv+"=1")
	p.cmd.Stdin = stdin
	p.cmd.Stdout = p.stdout
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.WaitDelay = 10 * time.Second // a leftover holding our pipes must not hang the test
	startCmd(t, p)
	return p
}

func startCmd(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", p.cmd.Args, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
}

// wait returns the exit code; it fails t when the process does not end in
// time or ends by a signal.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(waitLimit):
		t.Fatalf("%v did not end within %v; stderr: %s", p.cmd.Args, waitLimit, p.stderr)
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		t.Fatalf("%v: %v", p.cmd.Args, p.err)
	}
	code := p.cmd.ProcessState.ExitCode()
	if code < 0 {
		t.Fatalf("%v ended by %v; stderr: %s", p.cmd.Args, p.cmd.ProcessState, p.stderr)
	}
	return code
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// run runs a vmcli subcommand to its end.
func run(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := start(t, stdin, args...)
	code = p.wait(t)
	return code, p.stdout.String(), p.stderr.String()
}

// waitFor polls cond until it holds, failing t with what after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval of a condition wait
	}
}

// waitSession waits until session id in runDir has started its command.
func waitSession(t *testing.T, runDir, id string) vminit.Session {
	t.Helper()
	var s vminit.Session
	waitFor(t, "session "+id+" to start its command", func() bool {
		var err error
		s, err = vminit.ReadSession(runDir, id)
		return err == nil && s.PGID > 0
	})
	return s
}

// waitFileInt waits until path holds a number and returns it.
func waitFileInt(t *testing.T, path string) int {
	t.Helper()
	var n int
	waitFor(t, path+" to hold a number", func() bool {
		data, err := os.ReadFile(path)
		if err != nil || !bytes.HasSuffix(data, []byte("\n")) {
			return false
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil
	})
	return n
}

// procState returns the state of pid ('Z' for a zombie) or 0 when there is
// no such process.
func procState(pid int) byte {
	st, err := vminit.ReadProcStat(pid)
	if err != nil {
		return 0
	}
	return st.State
}

// running reports whether pid is a process that is not a zombie.
func running(pid int) bool {
	s := procState(pid)
	return s != 0 && s != 'Z'
}

// inGroup returns every process (zombies too) in process group pgid.
func inGroup(t *testing.T, pgid int) []vminit.ProcStat {
	t.Helper()
	all, err := vminit.Processes()
	if err != nil {
		t.Fatal(err)
	}
	var out []vminit.ProcStat
	for _, p := range all {
		if p.PGRP == pgid {
			out = append(out, p)
		}
	}
	return out
}

// childrenOf returns pid's children, zombies too.
func childrenOf(t *testing.T, pid int) []vminit.ProcStat {
	t.Helper()
	all, err := vminit.Processes()
	if err != nil {
		t.Fatal(err)
	}
	var out []vminit.ProcStat
	for _, p := range all {
		if p.PPID == pid {
			out = append(out, p)
		}
	}
	return out
}

// killAtCleanup SIGKILLs pid at the end of the test (a process the test let
// escape on purpose).
func killAtCleanup(t *testing.T, pid int) {
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
}

// deadPID returns the pid of a process that has ended and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// runDir returns a fresh run directory for one test.
func runDir(t *testing.T) string {
	return filepath.Join(t.TempDir(), "run")
}
