//go:build linux

package vminit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// procStat is what vminit needs from /proc/PID/stat.
type procStat struct {
	PID        int
	State      byte // 'R', 'S', 'D', 'Z', 'T', …
	PPID       int
	PGRP       int
	StartTicks uint64 // field 22: start time in clock ticks after boot
}

// parseProcStat parses the content of /proc/PID/stat. The command name (field
// 2) is in parentheses and may hold spaces and parentheses itself, so the
// fields are counted from the last ')'.
func parseProcStat(data []byte) (procStat, error) {
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return procStat{}, errors.New("no command field")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(data[:open])))
	if err != nil {
		return procStat{}, fmt.Errorf("pid: %w", err)
	}
	// Fields after ')': 3 state, 4 ppid, 5 pgrp, … 22 starttime.
	f := bytes.Fields(data[closing+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("%d fields after the command", len(f))
	}
	st := procStat{PID: pid, State: f[0][0]}
	if st.PPID, err = strconv.Atoi(string(f[1])); err != nil {
		return procStat{}, fmt.Errorf("ppid: %w", err)
	}
	if st.PGRP, err = strconv.Atoi(string(f[2])); err != nil {
		return procStat{}, fmt.Errorf("pgrp: %w", err)
	}
	if st.StartTicks, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
		return procStat{}, fmt.Errorf("starttime: %w", err)
	}
	return st, nil
}

// readProcStat reads /proc/PID/stat. Errors wrap os.ErrNotExist when there is
// no such process.
func readProcStat(pid int) (procStat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	st, err := parseProcStat(data)
	if err != nil {
		return procStat{}, fmt.Errorf("parse stat of %d: %w", pid, err)
	}
	return st, nil
}

// processes lists every process visible in /proc. Processes that end while
// it reads are left out.
func processes() ([]procStat, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	out := make([]procStat, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil {
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// descendants returns the processes below root (not root itself), zombies
// included, from one /proc listing.
func descendants(all []procStat, root int) []procStat {
	children := map[int][]procStat{}
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var out []procStat
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if seen[c.PID] {
				continue
			}
			seen[c.PID] = true
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	return out
}

// sameProcess reports whether pid is a live (not zombie) process started at
// startTicks.
func sameProcess(pid int, startTicks uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := readProcStat(pid)
	return err == nil && st.StartTicks == startTicks && st.State != 'Z'
}

// alive reports whether the session's wrapper still runs.
func (s Session) alive() bool { return sameProcess(s.PID, s.StartTicks) }

// childAlive reports whether the session's command (its group leader) still runs.
func (s Session) childAlive() bool {
	return s.PGID > 0 && s.ChildStartTicks != 0 && sameProcess(s.PGID, s.ChildStartTicks)
}

// liveSessions returns the sessions in runDir whose wrapper is alive.
func liveSessions(runDir string) ([]Session, error) {
	all, err := readSessions(runDir)
	if err != nil {
		return nil, err
	}
	live := all[:0]
	for _, s := range all {
		if s.alive() {
			live = append(live, s)
		}
	}
	return live, nil
}

// setSubreaper makes the calling process a child subreaper: orphaned
// descendants are reparented to it instead of to PID 1.
func setSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_CHILD_SUBREAPER: %w", err)
	}
	return nil
}

// exitStatus is what a waited-for process ended with.
type exitStatus struct {
	Code   int            // exit code, or 128+signal
	Signal syscall.Signal // 0 unless a signal killed it
}

func fromWaitStatus(ws unix.WaitStatus) exitStatus {
	if ws.Signaled() {
		return exitStatus{Code: 128 + int(ws.Signal()), Signal: syscall.Signal(ws.Signal())}
	}
	return exitStatus{Code: ws.ExitStatus()}
}

// reapAll collects every child that has ended, without blocking, and calls
// onExit for each. It returns true when the caller has no children left
// (ECHILD).
func reapAll(onExit func(pid int, st exitStatus)) (noChildren bool) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			return true
		case err != nil || pid <= 0:
			return false
		}
		if ws.Exited() || ws.Signaled() {
			onExit(pid, fromWaitStatus(ws))
		}
	}
}

// sendSignal sends sig to pid (a negative pid: a process group), ignoring
// ESRCH. Other errors are returned.
func sendSignal(pid int, sig syscall.Signal) error {
	if pid == 0 || pid == -1 {
		return fmt.Errorf("signal %d: refusing to signal pid %d", sig, pid)
	}
	err := unix.Kill(pid, sig)
	if err == nil || errors.Is(err, unix.ESRCH) {
		return nil
	}
	return fmt.Errorf("signal %d to %d: %w", sig, pid, err)
}

// wallNow returns the current time without its monotonic reading, in UTC,
// for files and comparisons with file times.
func wallNow() time.Time { return time.Now().Round(0).UTC() }
