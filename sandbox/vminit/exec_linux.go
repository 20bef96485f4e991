//go:build linux

package vminit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// forwarded are the signals Exec passes on to the command's process group.
var forwarded = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH,
}

// terminating are the forwarded signals after which the wrapper also kills
// the leftovers of a daemon session.
func terminating(sig syscall.Signal) bool {
	switch sig {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}

// Exec runs opts.Args as a registered session and returns the exit code the
// wrapper process should exit with: the command's, 128+N for a death by
// signal N, ExitTimeout, ExitCannotRun, ExitNotFound or ExitWrapperError (see
// the package doc). It makes the calling process a child subreaper, reaps
// every child it gets and handles SIGCHLD and the forwarded signals until it
// returns, so it must be the only thing the process does: call it from the
// vm-exec command's main and exit with its result. Cancelling ctx ends the
// command like a forwarded SIGTERM (SIGKILL after KillAfter).
func Exec(ctx context.Context, opts ExecOptions) int {
	w := &wrapper{opts: opts, stdin: opts.Stdin, stdout: opts.Stdout, stderr: opts.Stderr, log: opts.Log}
	if w.stdin == nil {
		w.stdin = os.Stdin
	}
	if w.stdout == nil {
		w.stdout = os.Stdout
	}
	if w.stderr == nil {
		w.stderr = os.Stderr
	}
	if w.opts.KillAfter <= 0 {
		w.opts.KillAfter = DefaultKillAfter
	}
	return w.run(ctx)
}

type wrapper struct {
	opts                  ExecOptions
	stdin, stdout, stderr *os.File
	log                   zerolog.Logger

	self       procStat
	session    Session
	registered bool
	pgid       int // the command's process group; 0 before it starts
}

// errSessionInUse: a live session already has the id.
var errSessionInUse = errors.New("session id in use")

// note writes one line for the user to the command's stderr.
func (w *wrapper) note(format string, args ...any) {
	fmt.Fprintf(w.stderr, "agents-sandbox: "+format+"\n", args...)
}

func (w *wrapper) run(ctx context.Context) int {
	o := w.opts
	if len(o.Args) == 0 || o.Args[0] == "" {
		w.note("vm-exec: no command given")
		return ExitWrapperError
	}
	id := o.ID
	if id == "" {
		id = randomID()
	} else if !ValidID(id) {
		w.note("vm-exec: invalid session id %q (want [A-Za-z0-9][A-Za-z0-9_.-]*, at most 128 bytes)", id)
		return ExitWrapperError
	}
	env, err := mergeEnv(os.Environ(), o.Env)
	if err != nil {
		w.note("vm-exec: %v", err)
		return ExitWrapperError
	}
	if o.WorkDir != "" {
		if fi, err := os.Stat(o.WorkDir); err != nil || !fi.IsDir() {
			w.note("cd %s: no such directory", o.WorkDir)
			return ExitWrapperError
		}
	}
	path, code, msg := lookCommand(o.Args[0], envValue(env, "PATH"), o.WorkDir)
	if code != 0 {
		w.note("%s: %s", o.Args[0], msg)
		return code
	}

	if w.self, err = readProcStat(os.Getpid()); err != nil {
		w.note("vm-exec: %v", err)
		return ExitWrapperError
	}
	if err := setSubreaper(); err != nil {
		w.note("vm-exec: %v", err)
		return ExitWrapperError
	}
	// Signals are caught before the command starts, so none is lost.
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigchld)
	defer signal.Stop(sigs)

	w.session = Session{
		ID: id, PID: w.self.PID, StartTicks: w.self.StartTicks, Daemon: o.Daemon,
		Cmd: summarizeCmd(o.Args), StartedAt: wallNow(),
	}
	switch err := w.register(); {
	case errors.Is(err, errSessionInUse):
		w.note("vm-exec: %v", err)
		return ExitWrapperError
	case err != nil:
		// The run dir is unusable, so Init's watchdog is off too (it cannot
		// see any session): run the command anyway, unregistered.
		w.log.Warn().Err(err).Str("session", id).Msg("session not registered; vm-kill cannot find it")
	default:
		w.registered = true
		defer w.unregister()
	}

	cmd := &exec.Cmd{
		Path: path, Args: o.Args, Env: env, Dir: o.WorkDir,
		Stdin: w.stdin, Stdout: w.stdout, Stderr: w.stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	for _, f := range []*os.File{w.stdin, w.stdout, w.stderr} {
		if fd := int(f.Fd()); isForeground(fd) {
			// On our controlling terminal the command's group must be the
			// foreground group, or it stops with SIGTTIN when it reads;
			// Ctrl-C and window resizes then reach it from the terminal.
			cmd.SysProcAttr = &syscall.SysProcAttr{Foreground: true, Ctty: fd}
			if o.WaitTTYSize > 0 {
				waitTTYSize(fd, o.WaitTTYSize)
			}
			break
		}
	}
	if err := cmd.Start(); err != nil {
		code, msg := startFailure(err)
		w.note("%s: %s", o.Args[0], msg)
		return code
	}
	child := cmd.Process.Pid
	defer cmd.Process.Release()
	w.pgid = child
	w.session.PGID = child
	if st, err := readProcStat(child); err == nil {
		w.session.ChildStartTicks = st.StartTicks
	}
	if w.registered {
		if err := w.update(); err != nil {
			w.log.Warn().Err(err).Str("session", id).Msg("record the command's process group")
		}
	}
	w.log.Debug().Str("session", id).Int("pid", child).Strs("cmd", o.Args).Msg("started")

	var (
		status                   *exitStatus
		timeoutC, killC          <-chan time.Time
		timedOut, killEverything bool
		done                     = ctx.Done()
	)
	if o.Timeout > 0 {
		t := time.NewTimer(o.Timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	terminate := func() {
		killEverything = true
		w.signalGroup(syscall.SIGTERM)
		if killC == nil {
			killC = time.After(o.KillAfter)
		}
	}
	for status == nil {
		select {
		case <-sigchld:
			reapAll(func(pid int, st exitStatus) {
				if pid == child {
					status = &st
				}
			})
		case s := <-sigs:
			sig := s.(syscall.Signal)
			w.signalGroup(sig)
			if terminating(sig) {
				killEverything = true
			}
		case <-timeoutC:
			timeoutC = nil
			timedOut = true
			w.note("timed out after %s; killing the command", o.Timeout)
			terminate()
		case <-done:
			done = nil
			terminate()
		case <-killC:
			killC = nil
			w.signalGroup(syscall.SIGKILL)
		}
	}
	w.log.Debug().Str("session", id).Int("code", status.Code).Msg("command ended")

	if !o.Daemon || killEverything || timedOut {
		w.killLeftovers(sigchld)
	} else {
		reapAll(func(int, exitStatus) {})
	}
	if timedOut {
		return ExitTimeout
	}
	return status.Code
}

// register claims the session id with a session file. Errors:
// errSessionInUse when a live session has the id; the sessions directory
// cannot be created or written.
func (w *wrapper) register() error {
	dir := SessionsDir(w.opts.RunDir)
	if err := ensureSessionsDir(w.opts.RunDir); err != nil {
		return err
	}
	data, err := json.Marshal(w.session)
	if err != nil {
		return fmt.Errorf("register session: %w", err)
	}
	for range 2 {
		err = writeAtomic(dir, w.session.ID+".pid", data, 0o644, true)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
		old, rerr := ReadSession(w.opts.RunDir, w.session.ID)
		if rerr == nil && old.alive() {
			return fmt.Errorf("session %q is already running (pid %d): %w", w.session.ID, old.PID, errSessionInUse)
		}
		// A dead wrapper's file: take the id over.
		if rerr := os.Remove(sessionFile(w.opts.RunDir, w.session.ID)); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return fmt.Errorf("remove stale session file: %w", rerr)
		}
	}
	if err != nil {
		return fmt.Errorf("register session: %w", err)
	}
	return nil
}

// update rewrites the session file (now with the process group).
func (w *wrapper) update() error {
	data, err := json.Marshal(w.session)
	if err != nil {
		return fmt.Errorf("update session: %w", err)
	}
	return writeAtomic(SessionsDir(w.opts.RunDir), w.session.ID+".pid", data, 0o644, false)
}

// unregister removes the session file and, for a non-daemon session, stamps
// the activity file so Init counts the session even if it never saw it.
func (w *wrapper) unregister() {
	if err := os.Remove(sessionFile(w.opts.RunDir, w.session.ID)); err != nil {
		w.log.Warn().Err(err).Str("session", w.session.ID).Msg("remove session file")
	}
	if w.opts.Daemon {
		return
	}
	if err := touch(activityFile(w.opts.RunDir)); err != nil {
		w.log.Warn().Err(err).Msg("stamp activity")
	}
}

// signalGroup sends sig to the command's process group.
func (w *wrapper) signalGroup(sig syscall.Signal) {
	if w.pgid <= 1 {
		return
	}
	if err := sendSignal(-w.pgid, sig); err != nil {
		w.log.Debug().Err(err).Msg("signal the command")
	}
}

// leftovers returns the live processes still in the command's group or below
// the wrapper.
func (w *wrapper) leftovers() []procStat {
	all, err := processes()
	if err != nil {
		w.log.Warn().Err(err).Msg("list leftovers")
		return nil
	}
	var out []procStat
	seen := map[int]bool{}
	for _, p := range descendants(all, w.self.PID) {
		if p.State != 'Z' {
			seen[p.PID] = true
			out = append(out, p)
		}
	}
	for _, p := range all {
		if p.PGRP == w.pgid && p.State != 'Z' && !seen[p.PID] && p.PID != w.self.PID {
			out = append(out, p)
		}
	}
	return out
}

// killLeftovers ends every process the command left behind: SIGTERM, SIGKILL
// after KillAfter, and reaps them (they are the wrapper's children, being a
// subreaper). It gives up 5 s after the SIGKILL (a process stuck in the
// kernel); those processes move to Init when the wrapper exits.
func (w *wrapper) killLeftovers(sigchld <-chan os.Signal) {
	type key struct {
		pid   int
		start uint64
	}
	termed := map[key]bool{}
	sig := syscall.SIGTERM
	killAt := time.NewTimer(w.opts.KillAfter)
	defer killAt.Stop()
	giveUp := time.NewTimer(w.opts.KillAfter + 5*time.Second)
	defer giveUp.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		noChildren := reapAll(func(int, exitStatus) {})
		left := w.leftovers()
		if noChildren && len(left) == 0 {
			return
		}
		w.signalGroup(sig)
		for _, p := range left {
			k := key{p.PID, p.StartTicks}
			if sig == syscall.SIGTERM && termed[k] {
				continue
			}
			termed[k] = true
			if err := sendSignal(p.PID, sig); err != nil {
				w.log.Debug().Err(err).Msg("signal a leftover")
			}
		}
		select {
		case <-sigchld:
		case <-poll.C:
		case <-killAt.C:
			sig = syscall.SIGKILL
		case <-giveUp.C:
			w.log.Warn().Int("left", len(left)).Msg("leftover processes did not die")
			return
		}
	}
}

// isForeground reports whether fd is this process's controlling terminal and
// this process's group is its foreground group.
func isForeground(fd int) bool {
	pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
}

// lookCommand resolves name like a shell does: a name with a slash is taken
// as a path, others are searched in path (empty entries mean the working
// directory). Relative results stay relative to workDir, where the command
// will run. code is 0 on success, else ExitNotFound or ExitCannotRun with a
// shell-like message.
func lookCommand(name, path, workDir string) (resolved string, code int, msg string) {
	inWorkDir := func(p string) string {
		if filepath.IsAbs(p) || workDir == "" {
			return p
		}
		return filepath.Join(workDir, p)
	}
	if strings.Contains(name, "/") {
		fi, err := os.Stat(inWorkDir(name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", ExitNotFound, "No such file or directory"
		case err != nil:
			return "", ExitCannotRun, errnoText(err)
		case fi.IsDir():
			return "", ExitCannotRun, "Is a directory"
		}
		if err := unix.Access(inWorkDir(name), unix.X_OK); err != nil {
			return "", ExitCannotRun, errnoText(err)
		}
		return name, 0, ""
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if dir == "." {
			p = "./" + name
		}
		fi, err := os.Stat(inWorkDir(p))
		if err != nil || fi.IsDir() || unix.Access(inWorkDir(p), unix.X_OK) != nil {
			continue
		}
		return p, 0, ""
	}
	return "", ExitNotFound, "command not found"
}

// startFailure maps an exec failure of a command that was found to an exit
// code and message: 126 whatever the cause (permission, bad interpreter,
// format), as shells do.
func startFailure(err error) (int, string) {
	var errno syscall.Errno
	if errors.As(err, &errno) && errno == syscall.ENOENT {
		return ExitCannotRun, "bad interpreter: No such file or directory"
	}
	return ExitCannotRun, errnoText(err)
}

// errnoText is the C library's text for the errno inside err, capitalised
// like a shell prints it.
func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		s := errno.Error()
		return strings.ToUpper(s[:1]) + s[1:]
	}
	return err.Error()
}

// mergeEnv returns base with extra's KEY=VALUE entries added, replacing
// entries of base with the same key. Error: an entry without "=" or key.
func mergeEnv(base, extra []string) ([]string, error) {
	if len(extra) == 0 {
		return base, nil
	}
	override := map[string]bool{}
	for _, kv := range extra {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad environment entry %q: want KEY=VALUE", kv)
		}
		override[k] = true
	}
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !override[k] {
			out = append(out, kv)
		}
	}
	return append(out, extra...), nil
}

// envValue returns the last value of key in env.
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// ensureSessionsDir creates <runDir> (0755) and <runDir>/sessions (1777, so
// any user can register while nobody can remove another's file).
func ensureSessionsDir(runDir string) error {
	dir := SessionsDir(runDir)
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return nil
	}
	if err := os.MkdirAll(orDefault(runDir), 0o755); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create sessions dir: %w", err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("chmod sessions dir: %w", err)
	}
	return nil
}

// touch sets path's mtime to now, creating it (mode 0666, so wrappers of
// every user can stamp it) when missing. Setting "now" (a NULL utimensat)
// needs only write access, not ownership. It never follows a symlink: the
// directory is writable by every user.
func touch(path string) error {
	err := unix.UtimesNanoAt(unix.AT_FDCWD, path, nil, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("touch %q: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o666)
	if errors.Is(err, fs.ErrExist) {
		return touch(path) // created meanwhile by another wrapper
	}
	if err != nil {
		return fmt.Errorf("touch %q: %w", path, err)
	}
	defer f.Close()
	if err := f.Chmod(0o666); err != nil {
		return fmt.Errorf("touch %q: %w", path, err)
	}
	return nil
}

// randomID returns 16 hex digits.
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// waitTTYSize waits (at most max) until the terminal on fd has a size. The
// engine sets the size of an exec's terminal only after the exec started:
// a command that reads it at once (stty size, a full-screen program's first
// frame) would otherwise see 0x0.
func waitTTYSize(fd int, max time.Duration) {
	deadline := time.Now().Add(max)
	for {
		ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		if err != nil || (ws.Row > 0 && ws.Col > 0) || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
