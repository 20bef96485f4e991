package mcp

import (
	"strings"
	"sync"
	"time"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// maxCoalesced bounds the message of one coalesced progress notification;
// older lines are cut first.
const maxCoalesced = 8 << 10

// throttle turns a call's progress reports into at most one notification
// per interval. Reports in between are coalesced: the notification carries
// the latest counters and the lines of every report since the last one, so
// nothing is lost (beyond maxCoalesced bytes of lines per notification). A
// send that fails (a full notification queue) is kept and retried with the
// next one.
type throttle struct {
	interval time.Duration
	send     func(tools.Progress) error

	mu      sync.Mutex
	pending *tools.Progress
	lines   []string
	size    int
	last    time.Time
	timer   *time.Timer
	closed  bool

	sendMu sync.Mutex // serializes sends, so notifications stay in order
}

func newThrottle(interval time.Duration, send func(tools.Progress) error) *throttle {
	return &throttle{interval: interval, send: send}
}

// report queues p; it never blocks on the transport.
func (t *throttle) report(p tools.Progress) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.addLocked(p)
	if t.timer != nil {
		return // a flush is already scheduled
	}
	wait := t.interval - time.Since(t.last)
	if wait < 0 {
		wait = 0
	}
	t.timer = time.AfterFunc(wait, t.fire)
}

func (t *throttle) addLocked(p tools.Progress) {
	q := p
	t.pending = &q
	if p.Message != "" {
		t.lines = append(t.lines, p.Message)
		t.size += len(p.Message) + 1
		for t.size > maxCoalesced && len(t.lines) > 1 {
			t.size -= len(t.lines[0]) + 1
			t.lines = t.lines[1:]
		}
	}
}

// take removes the coalesced notification, if any.
func (t *throttle) takeLocked() (tools.Progress, bool) {
	if t.pending == nil {
		return tools.Progress{}, false
	}
	p := *t.pending
	p.Message = strings.Join(t.lines, "\n")
	if len(p.Message) > maxCoalesced {
		p.Message = "…" + p.Message[len(p.Message)-maxCoalesced:]
	}
	t.pending, t.lines, t.size = nil, nil, 0
	return p, true
}

func (t *throttle) fire() {
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	t.mu.Lock()
	if wait := t.interval - time.Since(t.last); wait > 0 && !t.last.IsZero() && !t.closed {
		// Scheduled while the previous send was still running: keep the
		// interval from that send's end.
		t.timer = time.AfterFunc(wait, t.fire)
		t.mu.Unlock()
		return
	}
	t.timer = nil
	p, ok := t.takeLocked()
	t.mu.Unlock()
	if !ok {
		return
	}
	err := t.send(p)
	t.mu.Lock()
	t.last = time.Now() // the interval runs from the end of a send
	t.mu.Unlock()
	if err != nil {
		t.mu.Lock()
		// Put it back in front of anything newer and retry later.
		if t.pending == nil {
			t.pending = &p
		}
		if p.Message != "" {
			t.lines = append(strings.Split(p.Message, "\n"), t.lines...)
			t.size += len(p.Message) + 1
		}
		if t.timer == nil && !t.closed {
			t.timer = time.AfterFunc(t.interval, t.fire)
		}
		t.mu.Unlock()
	}
}

// close sends what is pending (one last try) and stops the throttle; later
// reports are ignored.
func (t *throttle) close() {
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	t.mu.Lock()
	t.closed = true
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	p, ok := t.takeLocked()
	t.mu.Unlock()
	if ok {
		_ = t.send(p)
	}
}
