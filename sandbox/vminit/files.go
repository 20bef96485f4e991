package vminit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// writeAtomic writes data to dir/name through a temp file in dir, so a reader
// never sees a partial file. exclusive: fail with an error wrapping
// fs.ErrExist when dir/name exists (link instead of rename).
func writeAtomic(dir, name string, data []byte, perm os.FileMode, exclusive bool) error {
	final := filepath.Join(dir, name)
	f, err := os.CreateTemp(dir, ".tmp-"+name+"-*")
	if err != nil {
		return fmt.Errorf("write %q: %w", final, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a rename there is nothing left to remove
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %q: %w", tmp, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("chmod %q: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %q: %w", tmp, err)
	}
	if exclusive {
		if err := os.Link(tmp, final); err != nil {
			return fmt.Errorf("create %q: %w", final, err)
		}
		return nil
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("rename %q: %w", final, err)
	}
	return nil
}

// ReadSession reads the session file of id in runDir (empty: DefaultRunDir).
// It says nothing about whether the session is alive. Errors: ErrNoSession
// (wrapped) when there is no such file or the id is invalid; unreadable or
// corrupt file.
func ReadSession(runDir, id string) (Session, error) {
	if !ValidID(id) {
		return Session{}, fmt.Errorf("read session %q: invalid id: %w", id, ErrNoSession)
	}
	path := sessionFile(runDir, id)
	data, err := readSmallFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Session{}, fmt.Errorf("read session %q: %w", id, ErrNoSession)
	}
	if err != nil {
		return Session{}, fmt.Errorf("read session %q: %w", id, err)
	}
	var s Session
	if err := json.Unmarshal(data, &s); err != nil {
		return Session{}, fmt.Errorf("parse session file %q: %w", path, err)
	}
	if s.ID != id || s.PID <= 0 {
		return Session{}, fmt.Errorf("parse session file %q: id %q, pid %d do not fit", path, s.ID, s.PID)
	}
	return s, nil
}

// readSessions returns every parseable session file in runDir's sessions
// directory, ordered by id, alive or not. A missing directory is no sessions.
func readSessions(runDir string) ([]Session, error) {
	dir := SessionsDir(runDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list sessions in %q: %w", dir, err)
	}
	var out []Session
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".pid")
		if !ok || !ValidID(id) {
			continue
		}
		s, err := ReadSession(runDir, id)
		if err != nil {
			continue // vanished meanwhile, or garbage: neither is a live session
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ReadStatus reads Init's status file in runDir (empty: DefaultRunDir).
// Errors wrap os.ErrNotExist when Init has not written one.
func ReadStatus(runDir string) (Status, error) {
	path := StatusFile(runDir)
	data, err := readSmallFile(path)
	if err != nil {
		return Status{}, fmt.Errorf("read status: %w", err)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return Status{}, fmt.Errorf("parse status %q: %w", path, err)
	}
	return st, nil
}

// maxFileSize bounds what readSmallFile reads.
const maxFileSize = 1 << 20

// readSmallFile reads a regular file of at most maxFileSize bytes without
// following a symlink: the sessions directory is writable by every user, and
// a planted link to /dev/zero or a FIFO must not hang or exhaust Init.
// Errors wrap os.ErrNotExist for a missing file.
func readSmallFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxFileSize)
	}
	return data, nil
}

// Limits of Session.Cmd, so a long prompt passed as an argument keeps the
// session file small.
const (
	maxCmdArgs   = 32
	maxCmdArgLen = 256
)

// summarizeCmd returns args cut to maxCmdArgs arguments of at most
// maxCmdArgLen bytes each; a cut is marked with "…".
func summarizeCmd(args []string) []string {
	out := make([]string, 0, min(len(args), maxCmdArgs+1))
	for i, a := range args {
		if i == maxCmdArgs {
			out = append(out, fmt.Sprintf("… (%d more)", len(args)-maxCmdArgs))
			break
		}
		if len(a) > maxCmdArgLen {
			a = strings.ToValidUTF8(a[:maxCmdArgLen], "") + "…"
		}
		out = append(out, a)
	}
	return out
}
