// Package vminit is the part of agents-sandbox that runs inside the VM: the
// VM's init process, the wrapper every host command runs under, and the way the
// host kills such a command. The agents-sandbox binary (static) is copied into
// the VM and its hidden subcommands call the functions here:
//
//	agents-sandbox vm-init [--idle-timeout 30m] [-- CMD ARGS...]    → Init
//	agents-sandbox vm-exec [--id ID] [--daemon] [--timeout D] -- CMD ARGS...  → Exec
//	agents-sandbox vm-kill ID [--signal KILL]                       → Kill
//
// # Run directory
//
// Everything the three share lives under a run directory, DefaultRunDir
// (/run/agents-sandbox) unless configured:
//
//	<run dir>/sessions/<id>.pid   one JSON Session per live vm-exec (written
//	                              atomically: temp file, then link or rename)
//	<run dir>/sessions/.activity  its mtime is when the last non-daemon session ended
//	<run dir>/status.json         Init's Status, rewritten every tick
//
// Init makes the sessions directory mode 1777 (like /tmp), so wrappers
// running as the unprivileged dev user can register while Init runs as root.
// The run dir must exist or be creatable by Init; when it is not, the idle
// watchdog is disabled (logged), because a watchdog that cannot see sessions
// would stop a busy VM. The recommended setup is a tmpfs mounted at the run
// dir with mode=1777: it works whatever user Init runs as, and a restarted VM
// starts with no stale files. Files in the world-writable directory are read
// without following symlinks and with a size cap.
//
// # Sessions and idleness
//
// A session is alive while its wrapper process exists with the recorded start
// time (field 22 of /proc/PID/stat), so a dead wrapper's leftover file or a
// reused pid never counts. The VM is busy while a non-daemon session is alive;
// a session that starts and ends between two ticks still counts, through the
// .activity stamp. Init stops everything and exits 0 once the VM has not been
// busy for the idle timeout (0 disables); its resolution is the tick (5 s by
// default).
//
// # Leftover processes
//
// The wrapper is a child subreaper, so every process the command leaves behind
// (background jobs, double-forked daemons, setsid'd processes) is reparented
// to it. When the command ends, the wrapper of a non-daemon session sends
// SIGTERM to everything left (the command's process group and all its
// remaining descendants), SIGKILL after KillAfter (2 s), reaps them, and only
// then exits: `bash -c 'sleep 100 &'` returns at once and the sleep is gone.
// Keep a background process with a --daemon session instead. A daemon
// session's leftovers are left running (they move to Init) unless the session
// ended by a timeout, a context cancellation or a terminating signal
// (SIGTERM, SIGINT, SIGHUP, SIGQUIT) delivered to the wrapper.
//
// # Terminals and signals
//
// The command runs in its own process group. When one of the wrapper's stdio
// descriptors is its controlling terminal (docker exec -t), that group is made
// the terminal's foreground group, so the command can read the terminal and
// gets Ctrl-C and SIGWINCH from it directly. SIGINT, SIGTERM, SIGHUP, SIGQUIT,
// SIGUSR1, SIGUSR2 and SIGWINCH sent to the wrapper are forwarded to the
// group. Kill signals the group (and, for SIGTERM and SIGKILL, the rest of the
// wrapper's descendants) but not the wrapper, which then exits with the
// command's status after its usual cleanup.
//
// # Exit codes of Exec
//
// The command's own exit code, 128+N when signal N killed it, ExitTimeout
// (124) after --timeout, ExitCannotRun (126) when it exists but cannot be
// executed, ExitNotFound (127) when it does not exist, and ExitWrapperError
// (125) when the wrapper itself failed (bad options, cannot register the
// session), as coreutils timeout and env do.
package vminit
