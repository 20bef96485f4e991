//go:build linux

package vminit

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Init is the VM's init process; it returns the exit code the process should
// exit with. It makes the process a child subreaper, reaps every zombie it
// gets, runs the idle watchdog over the sessions registered in opts.RunDir,
// writes the status file every tick, and stops the VM on the first of: the
// idle timeout (StopIdle), SIGTERM or SIGINT (StopSignal), ctx cancelled
// (StopContext), opts.Command ended (StopCommand). Stopping sends SIGTERM to
// every process (as PID 1: kill(-1); otherwise to its descendants and the
// registered sessions), SIGKILL to what is left after opts.Grace, and waits
// for them. It returns 0, or the command's exit code for StopCommand (127 or
// 126 when the command cannot start). Like Exec, it owns the process's
// signals and children until it returns.
func Init(ctx context.Context, opts InitOptions) int {
	if opts.Tick <= 0 {
		opts.Tick = DefaultTick
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	in := &initProc{opts: opts, log: opts.Log, pid1: os.Getpid() == 1, self: os.Getpid()}
	return in.run(ctx)
}

type initProc struct {
	opts InitOptions
	log  zerolog.Logger
	pid1 bool
	self int

	watchdog  bool
	startedAt time.Time // monotonic
	lastBusy  time.Time // monotonic
	busy      bool
	sessions  []Session
	reason    StopReason
	statusErr string // last status write error, logged once

	cmdPid    int
	cmdStatus *exitStatus
}

func (in *initProc) run(ctx context.Context) int {
	in.startedAt = time.Now()
	in.lastBusy = in.startedAt
	if err := setSubreaper(); err != nil && !in.pid1 {
		in.log.Warn().Err(err).Msg("orphans will not be reaped here")
	}
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigchld)
	defer signal.Stop(stop)

	in.watchdog = in.opts.IdleTimeout > 0
	if err := in.prepareRunDir(); err != nil {
		in.log.Error().Err(err).Msg("run dir unusable: idle watchdog disabled, no status file")
		in.watchdog = false
	}
	in.log.Info().Int("pid", in.self).Dur("idle_timeout", in.opts.IdleTimeout).Bool("watchdog", in.watchdog).
		Str("run_dir", orDefault(in.opts.RunDir)).Msg("vm-init started")

	if len(in.opts.Command) > 0 {
		if code := in.startCommand(); code != 0 {
			return code
		}
	}

	ticker := time.NewTicker(in.opts.Tick)
	defer ticker.Stop()
	in.check()
	done := ctx.Done()
	for in.reason == "" {
		select {
		case <-sigchld:
			in.reap()
		case s := <-stop:
			in.log.Info().Str("signal", s.String()).Msg("stopping")
			in.reason = StopSignal
		case <-done:
			in.reason = StopContext
		case <-ticker.C:
			in.reap() // a coalesced SIGCHLD loses nothing, this is belt and braces
			in.check()
		}
	}
	in.log.Info().Str("reason", string(in.reason)).Msg("stopping the VM")
	in.writeStatus(InitStopping)
	in.shutdown(sigchld)
	in.sessions = nil
	in.busy = false
	in.writeStatus(InitStopped)
	in.log.Info().Str("reason", string(in.reason)).Msg("vm-init stopped")
	if in.reason == StopCommand && in.cmdStatus != nil {
		return in.cmdStatus.Code
	}
	return 0
}

// prepareRunDir creates the sessions dir and removes files of sessions that
// are gone (a previous boot's, when the run dir is not a tmpfs).
func (in *initProc) prepareRunDir() error {
	if err := ensureSessionsDir(in.opts.RunDir); err != nil {
		return err
	}
	// Wrappers of every user register here, whoever made the directory.
	if err := os.Chmod(SessionsDir(in.opts.RunDir), 0o777|os.ModeSticky); err != nil {
		in.log.Warn().Err(err).Msg("make the sessions dir writable for every user")
	}
	// Created by Init (root in the VM) before any user can plant something
	// under that name.
	if err := touch(activityFile(in.opts.RunDir)); err != nil {
		return err
	}
	all, err := readSessions(in.opts.RunDir)
	if err != nil {
		return err
	}
	for _, s := range all {
		if !s.alive() && !s.childAlive() {
			if err := os.Remove(sessionFile(in.opts.RunDir, s.ID)); err != nil {
				in.log.Warn().Err(err).Str("session", s.ID).Msg("remove stale session file")
			}
		}
	}
	return nil
}

func (in *initProc) startCommand() int {
	path, code, msg := lookCommand(in.opts.Command[0], os.Getenv("PATH"), "")
	if code != 0 {
		in.log.Error().Str("cmd", in.opts.Command[0]).Msg(msg)
		return code
	}
	cmd := &exec.Cmd{
		Path: path, Args: in.opts.Command,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		code, msg := startFailure(err)
		in.log.Error().Str("cmd", in.opts.Command[0]).Msg(msg)
		return code
	}
	in.cmdPid = cmd.Process.Pid
	_ = cmd.Process.Release() // reaped by wait4(-1) like every other child
	return 0
}

// reap collects every ended child; the command's end stops the VM.
func (in *initProc) reap() {
	reapAll(func(pid int, st exitStatus) {
		if pid == in.cmdPid && in.cmdPid != 0 {
			in.cmdStatus = &st
			in.log.Info().Int("code", st.Code).Msg("command ended")
			if in.reason == "" {
				in.reason = StopCommand
			}
		}
	})
}

// check looks at the sessions, writes the status and starts the stop when the
// VM has been idle long enough.
func (in *initProc) check() {
	now := time.Now()
	sessions, err := liveSessions(in.opts.RunDir)
	if err != nil {
		in.log.Warn().Err(err).Msg("read sessions")
	}
	in.sessions = sessions
	in.busy = false
	for _, s := range sessions {
		if !s.Daemon {
			in.busy = true
		}
	}
	if in.busy {
		in.lastBusy = now
	} else if fi, err := os.Stat(activityFile(in.opts.RunDir)); err == nil {
		// A session that began and ended between two ticks.
		age := max(wallNow().Sub(fi.ModTime()), 0)
		if at := now.Add(-age); at.After(in.lastBusy) {
			in.lastBusy = at
		}
	}
	in.writeStatus(InitRunning)
	if in.watchdog && !in.busy && now.Sub(in.lastBusy) >= in.opts.IdleTimeout {
		in.log.Info().Dur("idle", now.Sub(in.lastBusy).Round(time.Millisecond)).Msg("idle timeout")
		in.reason = StopIdle
	}
}

func (in *initProc) writeStatus(state InitState) {
	wall := func(t time.Time) time.Time { return wallNow().Add(-time.Since(t)) }
	st := Status{
		State: state, PID: in.self, StartedAt: wall(in.startedAt), UpdatedAt: wallNow(),
		IdleTimeoutMS: in.opts.IdleTimeout.Milliseconds(), Busy: in.busy,
		StopReason: in.reason, Sessions: in.sessions, Watchdog: in.watchdog,
	}
	if st.Sessions == nil {
		st.Sessions = []Session{}
	}
	if !in.busy && state == InitRunning {
		idle := wall(in.lastBusy)
		st.IdleSince = &idle
		if in.watchdog {
			at := idle.Add(in.opts.IdleTimeout)
			st.StopAt = &at
		}
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err == nil {
		path := StatusFile(in.opts.RunDir)
		err = writeAtomic(filepath.Dir(path), filepath.Base(path), append(data, '\n'), 0o644, false)
	}
	if err != nil && err.Error() != in.statusErr {
		in.log.Warn().Err(err).Msg("write status")
	}
	if err != nil {
		in.statusErr = err.Error()
	} else {
		in.statusErr = ""
	}
}

// shutdown sends SIGTERM to everything, SIGKILL after the grace period, and
// returns when nothing is left or 5 s after the SIGKILL.
func (in *initProc) shutdown(sigchld <-chan os.Signal) {
	in.signalAll(syscall.SIGTERM)
	grace := time.NewTimer(in.opts.Grace)
	defer grace.Stop()
	giveUp := time.NewTimer(in.opts.Grace + 5*time.Second)
	defer giveUp.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		in.reap()
		left := in.remaining()
		if left == 0 {
			return
		}
		select {
		case <-sigchld:
		case <-poll.C:
		case <-grace.C:
			in.log.Warn().Int("left", left).Msg("grace period over: SIGKILL")
			in.signalAll(syscall.SIGKILL)
		case <-giveUp.C:
			in.log.Warn().Int("left", left).Msg("processes survived SIGKILL")
			return
		}
	}
}

// signalAll sends sig to every process init is responsible for: as PID 1,
// every process in the namespace; otherwise its descendants (and their
// process groups) and the registered sessions' wrappers, which pass the
// signal on to their commands (SIGKILL also goes to the commands' groups).
func (in *initProc) signalAll(sig syscall.Signal) {
	if in.pid1 {
		if err := unix.Kill(-1, sig); err != nil && err != unix.ESRCH {
			in.log.Warn().Err(err).Msg("signal all processes")
		}
		return
	}
	all, err := processes()
	if err != nil {
		in.log.Warn().Err(err).Msg("list processes")
	}
	own := unix.Getpgrp()
	groups := map[int]bool{}
	for _, p := range descendants(all, in.self) {
		if p.State == 'Z' {
			continue
		}
		_ = sendSignal(p.PID, sig)
		if p.PGRP != own && p.PGRP > 1 {
			groups[p.PGRP] = true
		}
	}
	for g := range groups {
		_ = sendSignal(-g, sig)
	}
	sessions, _ := readSessions(in.opts.RunDir)
	for _, s := range sessions {
		if s.alive() {
			_ = sendSignal(s.PID, sig)
		}
		if sig == syscall.SIGKILL && (s.alive() || s.childAlive()) && s.PGID > 1 {
			_ = sendSignal(-s.PGID, sig)
			for _, p := range descendants(all, s.PID) {
				_ = sendSignal(p.PID, sig)
			}
		}
	}
}

// remaining counts the live processes signalAll is waiting for.
func (in *initProc) remaining() int {
	all, err := processes()
	if err != nil {
		return 0
	}
	n := 0
	if in.pid1 {
		for _, p := range all {
			if p.PID != in.self && p.State != 'Z' {
				n++
			}
		}
		return n
	}
	for _, p := range descendants(all, in.self) {
		if p.State != 'Z' {
			n++
		}
	}
	sessions, _ := readSessions(in.opts.RunDir)
	for _, s := range sessions {
		if s.alive() || s.childAlive() {
			n++
		}
	}
	return n
}
