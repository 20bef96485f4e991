package vminit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Defaults.
const (
	// DefaultRunDir is where sessions register and Init writes its status.
	DefaultRunDir = "/run/agents-sandbox"
	// DefaultIdleTimeout is the idle timeout the VM entrypoint passes.
	DefaultIdleTimeout = 30 * time.Minute
	// DefaultTick is how often Init checks sessions and writes its status.
	DefaultTick = 5 * time.Second
	// DefaultGrace is how long Init waits after SIGTERM before SIGKILL when
	// it shuts the VM down.
	DefaultGrace = 5 * time.Second
	// DefaultKillAfter is how long Exec waits after SIGTERM before SIGKILL,
	// on a timeout and when killing leftovers.
	DefaultKillAfter = 2 * time.Second
)

// Exit codes of Exec besides the command's own.
const (
	ExitTimeout      = 124 // --timeout expired; the process group was killed
	ExitWrapperError = 125 // the wrapper failed: bad options, session not registered
	ExitCannotRun    = 126 // the command exists but cannot be executed
	ExitNotFound     = 127 // the command does not exist
)

// ErrNoSession: no live session has that id (never registered, already
// ended, or its wrapper died).
var ErrNoSession = errors.New("no such session")

// SessionsDir is the directory sessions register in: <runDir>/sessions.
// An empty runDir means DefaultRunDir.
func SessionsDir(runDir string) string {
	return filepath.Join(orDefault(runDir), "sessions")
}

// StatusFile is the path of Init's status file: <runDir>/status.json.
// An empty runDir means DefaultRunDir.
func StatusFile(runDir string) string {
	return filepath.Join(orDefault(runDir), "status.json")
}

func orDefault(runDir string) string {
	if runDir == "" {
		return DefaultRunDir
	}
	return runDir
}

// activityFile is touched by non-daemon wrappers when they end.
func activityFile(runDir string) string {
	return filepath.Join(SessionsDir(runDir), ".activity")
}

func sessionFile(runDir, id string) string {
	return filepath.Join(SessionsDir(runDir), id+".pid")
}

// InitOptions configures Init.
type InitOptions struct {
	// RunDir holds sessions and the status file; empty: DefaultRunDir.
	RunDir string
	// IdleTimeout: how long the VM may go without a live non-daemon session
	// before Init stops it. 0 disables the watchdog.
	IdleTimeout time.Duration
	// Tick is how often sessions are checked and the status written;
	// 0: DefaultTick.
	Tick time.Duration
	// Grace is how long Init waits for processes after SIGTERM before
	// SIGKILL on shutdown; 0: DefaultGrace.
	Grace time.Duration
	// Command, when set, is started as Init's child in its own process
	// group, with Init's stdio. Init then ends when it exits (after stopping
	// everything else) and returns its exit code, like tini. Empty: Init
	// runs until idle or signalled.
	Command []string
	// Log receives Init's own messages (the container log: stderr).
	Log zerolog.Logger
}

// ExecOptions configures Exec.
type ExecOptions struct {
	// RunDir is where the session registers; empty: DefaultRunDir.
	RunDir string
	// ID names the session for Kill and the status file ([A-Za-z0-9][A-Za-z0-9_.-]*,
	// at most 128 bytes); empty: a random id. A live session with the same
	// id makes Exec fail with ExitWrapperError. When the run dir cannot be
	// written (then Init's watchdog is off as well) the command runs
	// unregistered, with a warning to Log.
	ID string
	// Daemon marks a long-running server: it does not keep the VM busy and
	// its leftover processes are not killed when it ends normally.
	Daemon bool
	// Timeout, when positive, kills the command's process group (SIGTERM,
	// SIGKILL after KillAfter) and makes Exec return ExitTimeout.
	Timeout time.Duration
	// KillAfter is the SIGTERM → SIGKILL delay; 0: DefaultKillAfter.
	KillAfter time.Duration
	// WaitTTYSize, when positive, waits up to that long for the command's
	// terminal to get a size before starting it (the engine resizes an
	// exec's terminal only after it started).
	WaitTTYSize time.Duration
	// WorkDir is the command's working directory; empty: the wrapper's.
	WorkDir string
	// Env holds KEY=VALUE entries added to (overriding) the inherited
	// environment.
	Env []string
	// Args is the command and its arguments; Args[0] is looked up in PATH
	// when it has no slash.
	Args []string
	// Stdin, Stdout and Stderr are handed to the command as they are (the
	// same descriptors: byte-exact, terminals stay terminals); nil: the
	// wrapper's own. The wrapper writes only its error and timeout notes,
	// prefixed "agents-sandbox: ", to Stderr.
	Stdin, Stdout, Stderr *os.File
	// Log receives debug messages; the zero value discards them (never
	// point it at the command's stdout).
	Log zerolog.Logger
}

// Session is the content of a session file <run dir>/sessions/<id>.pid.
type Session struct {
	ID string `json:"id"`
	// PID is the wrapper's pid; StartTicks its start time (clock ticks since
	// boot, /proc/PID/stat field 22), which tells a reused pid apart.
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	// PGID is the command's process group (the command's pid); 0 while it
	// is being started. ChildStartTicks is the command's start time.
	PGID            int    `json:"pgid"`
	ChildStartTicks uint64 `json:"child_start_ticks,omitempty"`
	// Daemon sessions do not keep the VM busy.
	Daemon    bool      `json:"daemon,omitempty"`
	Cmd       []string  `json:"cmd"`
	StartedAt time.Time `json:"started_at"`
}

// InitState is Init's lifecycle state in the status file.
type InitState string

// Init states.
const (
	InitRunning  InitState = "running"
	InitStopping InitState = "stopping"
	InitStopped  InitState = "stopped"
)

// StopReason says why Init stopped the VM.
type StopReason string

// Stop reasons.
const (
	StopIdle    StopReason = "idle"    // the idle timeout expired
	StopSignal  StopReason = "signal"  // SIGTERM or SIGINT (docker stop)
	StopContext StopReason = "context" // Init's context was cancelled
	StopCommand StopReason = "command" // InitOptions.Command exited
)

// Status is the content of <run dir>/status.json, written by Init every tick
// and once more when it stops. Times are UTC.
type Status struct {
	State     InitState `json:"state"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// IdleTimeoutMS is the idle timeout in milliseconds; 0: disabled.
	IdleTimeoutMS int64 `json:"idle_timeout_ms"`
	// Busy: a non-daemon session was alive at UpdatedAt.
	Busy bool `json:"busy"`
	// IdleSince is when the VM was last seen busy (or Init started); nil
	// while busy.
	IdleSince *time.Time `json:"idle_since,omitempty"`
	// StopAt is when the idle watchdog will stop the VM unless a session
	// starts; nil while busy or when disabled.
	StopAt *time.Time `json:"stop_at,omitempty"`
	// StopReason is set once State is stopping or stopped.
	StopReason StopReason `json:"stop_reason,omitempty"`
	// Sessions are the live sessions, daemon ones included, ordered by id.
	Sessions []Session `json:"sessions"`
	// Watchdog is false when the idle watchdog is off (IdleTimeout 0, or the
	// run dir could not be created).
	Watchdog bool `json:"watchdog"`
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidID reports whether id can name a session: [A-Za-z0-9][A-Za-z0-9_.-]*,
// at most 128 bytes (it becomes a file name).
func ValidID(id string) bool { return idPattern.MatchString(id) }

// ParseIdleTimeout parses an idle timeout: a Go duration ("30m", "1h30m",
// "90s"), or "0", "off", "never", "none" for disabled (0). Errors: negative
// or malformed values, and bare numbers other than 0 (the unit would be a
// guess).
func ParseIdleTimeout(s string) (time.Duration, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "0", "off", "never", "none", "disabled":
		return 0, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("parse idle timeout %q: %w (want a duration like 30m, or off)", s, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("parse idle timeout %q: negative", s)
	}
	return d, nil
}

var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"KILL": syscall.SIGKILL, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"TERM": syscall.SIGTERM, "ALRM": syscall.SIGALRM, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "WINCH": syscall.SIGWINCH, "PIPE": syscall.SIGPIPE,
}

// ParseSignal parses a signal name or number: "KILL", "SIGKILL", "kill", "9".
// Names: HUP INT QUIT KILL USR1 USR2 TERM ALRM CONT STOP WINCH PIPE.
// Numbers must be 1–64.
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("parse signal %q: out of range 1-64", s)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "SIG")
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("parse signal %q: unknown signal name", s)
}
