//go:build linux

package vminit_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
)

// startInit runs vm-init on rd with a 20 ms tick and the given extra args.
func startInit(t *testing.T, rd string, args ...string) *proc {
	t.Helper()
	return start(t, nil, append([]string{"vm-init", "--run-dir", rd, "--tick", "20ms"}, args...)...)
}

// waitStatus waits until the status file satisfies cond and returns it.
func waitStatus(t *testing.T, rd, what string, cond func(vminit.Status) bool) vminit.Status {
	t.Helper()
	var st vminit.Status
	waitFor(t, "status: "+what, func() bool {
		var err error
		st, err = vminit.ReadStatus(rd)
		return err == nil && cond(st)
	})
	return st
}

func finalStatus(t *testing.T, rd string, reason vminit.StopReason) {
	t.Helper()
	st, err := vminit.ReadStatus(rd)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != vminit.InitStopped || st.StopReason != reason {
		t.Errorf("final status %s/%s, want %s/%s", st.State, st.StopReason, vminit.InitStopped, reason)
	}
}

func TestInitIdleExit(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	began := time.Now()
	p := startInit(t, rd, "--idle-timeout", "300ms")
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d; log: %s", code, p.stderr)
	}
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Errorf("stopped after %v, before the 300ms idle timeout", took)
	}
	finalStatus(t, rd, vminit.StopIdle)
}

// TestInitNotActivity: sessions that must not keep the VM up.
func TestInitNotActivity(t *testing.T) {
	t.Parallel()
	t.Run("stale and reused pids", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		self, err := vminit.ReadProcStat(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		writeSession(t, rd, vminit.Session{ID: "dead", PID: deadPID(t), StartTicks: 1, PGID: deadPID(t)})
		// A live pid with another start time: the pid was reused.
		writeSession(t, rd, vminit.Session{ID: "reused", PID: self.PID, StartTicks: self.StartTicks - 1, PGID: self.PGRP})
		// Planted by a user of the world-writable directory: must not hang
		// or exhaust Init.
		if err := os.Symlink("/dev/zero", filepath.Join(vminit.SessionsDir(rd), "zero.pid")); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(filepath.Join(vminit.SessionsDir(rd), "fifo.pid"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startInit(t, rd, "--idle-timeout", "300ms")
		if code := p.wait(t); code != 0 {
			t.Fatalf("exit code %d; log: %s", code, p.stderr)
		}
		finalStatus(t, rd, vminit.StopIdle)
		for _, id := range []string{"dead", "reused"} {
			if _, err := os.Stat(filepath.Join(vminit.SessionsDir(rd), id+".pid")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("stale session file %s: %v, want it removed at start", id, err)
			}
		}
	})
	t.Run("daemon", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		d := start(t, nil, "vm-exec", "--run-dir", rd, "--daemon", "--id", "srv", "--", "sleep", "1000")
		waitSession(t, rd, "srv")
		p := startInit(t, rd, "--idle-timeout", "300ms")
		if code := p.wait(t); code != 0 {
			t.Fatalf("exit code %d; log: %s", code, p.stderr)
		}
		finalStatus(t, rd, vminit.StopIdle)
		// Stopping the VM terminates the daemon too.
		if code := d.wait(t); code != 143 {
			t.Errorf("daemon exit code %d, want 143", code)
		}
	})
}

// TestInitBusyWhileSession: a live session keeps Init up past the idle
// timeout; once it ends Init stops by itself.
func TestInitBusyWhileSession(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	s := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "busy", "--", "sleep", "1000")
	waitSession(t, rd, "busy")
	p := startInit(t, rd, "--idle-timeout", "300ms")
	st := waitStatus(t, rd, "busy for 3 idle timeouts", func(st vminit.Status) bool {
		return st.Busy && st.UpdatedAt.Sub(st.StartedAt) > 900*time.Millisecond
	})
	if p.exited() {
		t.Fatalf("init exited while a session was alive; log: %s", p.stderr)
	}
	if len(st.Sessions) != 1 || st.Sessions[0].ID != "busy" || st.IdleSince != nil || st.StopAt != nil || !st.Watchdog {
		t.Errorf("status while busy: %+v", st)
	}
	if err := vminit.Kill(rd, "busy", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := s.wait(t); code != 143 {
		t.Errorf("session exit code %d, want 143", code)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("init exit code %d; log: %s", code, p.stderr)
	}
	finalStatus(t, rd, vminit.StopIdle)
}

// TestInitCountsShortSessions: a non-daemon session stamps the activity
// file when it ends, and Init resets its idle clock from the stamp, so a
// session that starts and ends between two checks still counts.
func TestInitCountsShortSessions(t *testing.T) {
	t.Parallel()
	rd := runDir(t)
	p := start(t, nil, "vm-init", "--run-dir", rd, "--tick", "50ms", "--idle-timeout", "10m")
	first := waitStatus(t, rd, "written", func(st vminit.Status) bool { return st.State == vminit.InitRunning })
	if first.IdleSince == nil || first.StopAt == nil || first.Busy || first.IdleTimeoutMS != 600000 {
		t.Fatalf("first status: %+v", first)
	}
	activity := filepath.Join(vminit.SessionsDir(rd), ".activity")
	stamp := func() time.Time {
		t.Helper()
		fi, err := os.Stat(activity)
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}

	before := time.Now()
	if code, _, stderr := run(t, nil, "vm-exec", "--run-dir", rd, "--", "true"); code != 0 {
		t.Fatalf("exec: %d %s", code, stderr)
	}
	if m := stamp(); m.Before(before.Add(-10 * time.Millisecond)) {
		t.Errorf("activity stamp %v, want after the session began (%v)", m, before)
	}
	m := stamp()
	if code, _, stderr := run(t, nil, "vm-exec", "--run-dir", rd, "--daemon", "--", "true"); code != 0 {
		t.Fatalf("exec: %d %s", code, stderr)
	}
	if got := stamp(); !got.Equal(m) {
		t.Errorf("a daemon session moved the activity stamp from %v to %v", m, got)
	}

	// A stamp with no session seen alive: only the stamp can move idle_since.
	at := time.Now()
	if err := os.Chtimes(activity, at, at); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, rd, "a check after the stamp", func(st vminit.Status) bool { return st.UpdatedAt.After(at) })
	if st.IdleSince == nil || st.IdleSince.Before(at.Add(-10*time.Millisecond)) || st.Busy {
		t.Errorf("idle since %v (busy %v), want at the stamp %v", st.IdleSince, st.Busy, at)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	finalStatus(t, rd, vminit.StopSignal)
}

// TestInitReapsOrphans: orphans reparented to Init are reaped; none stays a
// zombie.
func TestInitReapsOrphans(t *testing.T) {
	t.Parallel()
	t.Run("killed orphans", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		p := startInit(t, rd, "--idle-timeout", "0", "--", "sh", "-c",
			`for i in $(seq 100); do (sleep 1000 &) ; done; exec sleep 1000`)
		initPID := p.cmd.Process.Pid
		// The orphans are Init's children once their subshells exit; the
		// command itself is the one child leading its own group.
		var orphans []int
		waitFor(t, "100 orphans under init", func() bool {
			orphans = orphans[:0]
			for _, c := range childrenOf(t, initPID) {
				if c.PID != c.PGRP && c.State != 'Z' {
					orphans = append(orphans, c.PID)
				}
			}
			return len(orphans) == 100
		})
		for _, pid := range orphans {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "init to reap the 100 orphans", func() bool { return len(childrenOf(t, initPID)) == 1 })
		for _, c := range childrenOf(t, initPID) {
			if c.State == 'Z' {
				t.Errorf("zombie child %d", c.PID)
			}
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != 0 {
			t.Errorf("exit code %d; log: %s", code, p.stderr)
		}
	})
	t.Run("short-lived orphans", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		done := filepath.Join(t.TempDir(), "done")
		p := startInit(t, rd, "--idle-timeout", "0", "--", "sh", "-c",
			`for i in $(seq 100); do (sleep 0.1 &) ; done; echo 1 > `+done+`; exec sleep 1000`)
		initPID := p.cmd.Process.Pid
		waitFileInt(t, done)
		waitFor(t, "the orphans to end and be reaped", func() bool { return len(childrenOf(t, initPID)) == 1 })
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != 0 {
			t.Errorf("exit code %d; log: %s", code, p.stderr)
		}
	})
}

// TestInitStop: SIGTERM stops everything, SIGKILL after the grace period for
// what ignores it; the command's exit ends Init with its code.
func TestInitStop(t *testing.T) {
	t.Parallel()
	t.Run("SIGTERM", func(t *testing.T) {
		t.Parallel()
		rd := runDir(t)
		pidFile := filepath.Join(t.TempDir(), "pid")
		p := startInit(t, rd, "--idle-timeout", "0", "--grace", "300ms", "--", "sh", "-c",
			`trap '' TERM; echo $$ > `+pidFile+`; while :; do sleep 0.05; done`)
		stubborn := waitFileInt(t, pidFile)
		s := start(t, nil, "vm-exec", "--run-dir", rd, "--id", "s", "--", "sleep", "1000")
		waitSession(t, rd, "s")
		waitStatus(t, rd, "the session seen", func(st vminit.Status) bool { return st.Busy })
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != 0 {
			t.Errorf("init exit code %d; log: %s", code, p.stderr)
		}
		finalStatus(t, rd, vminit.StopSignal)
		if running(stubborn) {
			t.Errorf("the TERM-ignoring command %d survived", stubborn)
		}
		if code := s.wait(t); code != 143 {
			t.Errorf("session exit code %d, want 143", code)
		}
	})
	for _, tt := range []struct {
		name string
		cmd  []string
		want int
	}{
		{"command exit code", []string{"sh", "-c", "exit 4"}, 4},
		{"command not found", []string{"no-such-command-x9"}, vminit.ExitNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startInit(t, runDir(t), append([]string{"--idle-timeout", "0", "--"}, tt.cmd...)...)
			if code := p.wait(t); code != tt.want {
				t.Errorf("exit code %d, want %d; log: %s", code, tt.want, p.stderr)
			}
		})
	}
}

// TestInitUnusableRunDir: a run dir Init cannot create turns the watchdog
// off (it could not see sessions) instead of failing the VM.
func TestInitUnusableRunDir(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startInit(t, filepath.Join(file, "run"), "--idle-timeout", "100ms")
	waitFor(t, "init to start without a watchdog", func() bool {
		log := p.stderr.String()
		return strings.Contains(log, "run dir unusable") && strings.Contains(log, `"watchdog":false`)
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d; log: %s", code, p.stderr)
	}
}
