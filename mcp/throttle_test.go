package mcp

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// TestThrottleCoalescesWithoutLoss reports 2000 lines as fast as possible
// through a throttle whose transport refuses every third send (as a full
// notification queue does): every line arrives, in order, in far fewer
// notifications than reports, never two closer than the interval.
func TestThrottleCoalescesWithoutLoss(t *testing.T) {
	const interval = 20 * time.Millisecond
	var mu sync.Mutex
	var sent []tools.Progress
	var times []time.Time
	calls := 0
	th := newThrottle(interval, func(p tools.Progress) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls%3 == 0 {
			return errors.New("notification queue full")
		}
		sent = append(sent, p)
		times = append(times, time.Now())
		return nil
	})
	const n = 2000
	start := time.Now()
	sentCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	for i := 1; i <= n; i++ {
		th.report(tools.Progress{Current: float64(i), Message: fmt.Sprintf("line %d", i)})
		if i%200 == 0 {
			// Let a flush happen mid-stream before reporting more.
			want := sentCount() + 1
			for sentCount() < want {
				<-time.After(interval / 4)
			}
		}
	}
	th.close()
	elapsed := time.Since(start)

	mu.Lock()
	defer mu.Unlock()
	var lines []string
	for _, p := range sent {
		lines = append(lines, strings.Split(p.Message, "\n")...)
	}
	if len(lines) != n {
		t.Fatalf("%d lines arrived, want %d", len(lines), n)
	}
	for i, l := range lines {
		if l != fmt.Sprintf("line %d", i+1) {
			t.Fatalf("line %d is %q: order lost", i+1, l)
		}
	}
	if last := sent[len(sent)-1].Current; last != n {
		t.Errorf("last progress %v, want %d", last, n)
	}
	if max := int(elapsed/interval) + 3; len(sent) > max {
		t.Errorf("%d notifications in %s: more than one per %s", len(sent), elapsed, interval)
	}
	for i := 1; i < len(times)-1; i++ { // the final flush on close may come early
		if gap := times[i].Sub(times[i-1]); gap < interval/2 {
			t.Errorf("notifications %d and %d only %s apart", i-1, i, gap)
		}
	}
}

// TestThrottleBoundsMessage: a flood of long lines between two
// notifications is cut from the front to maxCoalesced bytes.
func TestThrottleBoundsMessage(t *testing.T) {
	var mu sync.Mutex
	var got []tools.Progress
	th := newThrottle(time.Hour, func(p tools.Progress) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, p)
		return nil
	})
	for i := 0; i < 100; i++ {
		th.report(tools.Progress{Current: float64(i + 1), Message: strings.Repeat("x", 1000)})
	}
	th.close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 || len(got) > 2 {
		t.Fatalf("%d notifications, want 1 or 2 (an hour apart at most one, then the final flush)", len(got))
	}
	for _, p := range got {
		if l := len(p.Message); l > maxCoalesced+len("…") {
			t.Errorf("coalesced message of %d bytes", l)
		}
	}
	if last := got[len(got)-1].Current; last != 100 {
		t.Errorf("last progress %v, want 100", last)
	}
}
