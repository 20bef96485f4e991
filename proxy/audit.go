package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Action is what the proxy did about a request.
type Action string

const (
	// ActionSubstituted: a secret's placeholder was replaced by its value for an allowed host.
	ActionSubstituted Action = "substituted"
	// ActionBlocked: a request carried a placeholder headed for a host its secret does not name,
	// and was not sent.
	ActionBlocked Action = "blocked"
	// ActionRefused: a request was refused for another reason: egress policy, destination
	// mismatch (CONNECT target, SNI, Host), missing proxy credential.
	ActionRefused Action = "refused"
)

// AuditEvent is one audit record. It never holds a secret value, nor a URL query.
type AuditEvent struct {
	Time   time.Time `json:"time"`
	VM     string    `json:"vm,omitempty"`
	Secret string    `json:"secret,omitempty"` // the secret's name
	Host   string    `json:"host,omitempty"`   // destination host, without port
	Method string    `json:"method,omitempty"`
	Path   string    `json:"path,omitempty"` // URL path as the VM sent it, without query
	Action Action    `json:"action"`
	Reason string    `json:"reason,omitempty"`
}

// DefaultAuditRing is how many events Server.Audit can return when Options.AuditRing is 0.
const DefaultAuditRing = 1000

// auditLog keeps the last events in memory and appends each as a JSON line to a file.
type auditLog struct {
	mu   sync.Mutex
	ring []AuditEvent
	next int // index of the next write in ring
	full bool
	file *os.File
}

func openAuditLog(path string, size int) (*auditLog, error) {
	if size <= 0 {
		size = DefaultAuditRing
	}
	a := &auditLog{ring: make([]AuditEvent, size)}
	if path == "" {
		return a, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	a.file = f
	return a, nil
}

// add records e and returns the error of appending it to the file, if any (the event is kept in
// memory either way).
func (a *auditLog) add(e AuditEvent) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ring[a.next] = e
	a.next = (a.next + 1) % len(a.ring)
	if a.next == 0 {
		a.full = true
	}
	if a.file == nil {
		return nil
	}
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode audit event: %w", err)
	}
	if _, err := a.file.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("append audit event: %w", err)
	}
	return nil
}

// last returns up to n events, oldest first; n <= 0 means all that are kept.
func (a *auditLog) last(n int) []AuditEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	count := a.next
	if a.full {
		count = len(a.ring)
	}
	if n <= 0 || n > count {
		n = count
	}
	out := make([]AuditEvent, 0, n)
	for i := n; i > 0; i-- {
		out = append(out, a.ring[(a.next-i+len(a.ring))%len(a.ring)])
	}
	return out
}

func (a *auditLog) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.file == nil {
		return nil
	}
	err := a.file.Close()
	a.file = nil
	if err != nil {
		return fmt.Errorf("close audit log: %w", err)
	}
	return nil
}

// ReadAuditLog returns the last n events (oldest first; n <= 0: all) of an audit log file written
// by a Server, for `agents-sandbox proxy audit` when the proxy runs elsewhere. A missing file
// yields no events and no error; a line that is not an event is an error naming its line number.
func ReadAuditLog(path string, n int) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	defer f.Close()
	var events []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("read audit log %s: line %d: %w", path, line, err)
		}
		events = append(events, e)
		if n > 0 && len(events) > 2*n {
			events = append(events[:0], events[len(events)-n:]...)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read audit log %s: %w", path, err)
	}
	if n > 0 && len(events) > n {
		events = events[len(events)-n:]
	}
	return events, nil
}
