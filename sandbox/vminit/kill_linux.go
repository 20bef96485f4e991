//go:build linux

package vminit

import (
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Kill sends sig to the command of session id registered in runDir (empty:
// DefaultRunDir): to the command's process group and, for SIGTERM and
// SIGKILL, to every other process below the wrapper too (leftovers that left
// the group, a daemon's children). The wrapper itself is not signalled: it
// sees its command end, cleans up, unregisters and exits with the command's
// status (128+sig), so the host's first exec returns normally. When the
// wrapper is gone but its command still runs (the wrapper was SIGKILLed),
// the command's group is signalled all the same. Kill does not wait for the
// session to end.
//
// Errors: ErrNoSession (wrapped) for an unknown, invalid or ended id; a
// session whose command has not started within 1 s; permission errors.
func Kill(runDir, id string, sig syscall.Signal) error {
	s, err := ReadSession(runDir, id)
	for deadline := time.Now().Add(time.Second); err == nil && s.PGID == 0 && s.alive() && time.Now().Before(deadline); {
		// The wrapper registers before it starts the command and records the
		// group right after: a Kill racing a fresh session waits for it.
		time.Sleep(10 * time.Millisecond)
		s, err = ReadSession(runDir, id)
	}
	if err != nil {
		return fmt.Errorf("kill session %q: %w", id, err)
	}
	switch {
	case s.alive():
		if s.PGID <= 1 {
			return fmt.Errorf("kill session %q: its command has not started", id)
		}
		return killSession(s, sig)
	case s.childAlive():
		if err := sendSignal(-s.PGID, sig); err != nil {
			return fmt.Errorf("kill session %q: %w", id, err)
		}
		return nil
	default:
		return fmt.Errorf("kill session %q: ended: %w", id, ErrNoSession)
	}
}

func killSession(s Session, sig syscall.Signal) error {
	var errs []error
	// The descendants are listed before the group is signalled: once a
	// parent in the group dies, its orphans are reparented (to a subreaper
	// above the wrapper, or to init) and no longer look like descendants.
	var below []procStat
	if sig == syscall.SIGTERM || sig == syscall.SIGKILL {
		all, err := processes()
		if err != nil {
			errs = append(errs, err)
		}
		below = descendants(all, s.PID)
	}
	if err := sendSignal(-s.PGID, sig); err != nil {
		errs = append(errs, err)
	}
	if sig == syscall.SIGTERM || sig == syscall.SIGKILL {
		for _, p := range below {
			if p.State == 'Z' || p.PGRP == s.PGID {
				continue
			}
			if err := sendSignal(p.PID, sig); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kill session %q: %w", s.ID, err)
	}
	return nil
}
