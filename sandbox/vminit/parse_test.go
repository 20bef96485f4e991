package vminit_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
)

func TestParseIdleTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"30m", 30 * time.Minute, false},
		{"1h30m", 90 * time.Minute, false},
		{" 90s ", 90 * time.Second, false},
		{"0", 0, false},
		{"off", 0, false},
		{"Never", 0, false},
		{"0s", 0, false},
		{"-5m", 0, true},
		{"30", 0, true},
		{"", 0, true},
		{"soon", 0, true},
	}
	for _, tt := range tests {
		got, err := vminit.ParseIdleTimeout(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseIdleTimeout(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseSignal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    syscall.Signal
		wantErr bool
	}{
		{"KILL", syscall.SIGKILL, false},
		{"SIGKILL", syscall.SIGKILL, false},
		{"term", syscall.SIGTERM, false},
		{"sigint", syscall.SIGINT, false},
		{"9", syscall.SIGKILL, false},
		{"15", syscall.SIGTERM, false},
		{"0", 0, true},
		{"65", 0, true},
		{"BOGUS", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := vminit.ParseSignal(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestValidID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{
		"a": true, "exec-1234.x_y": true, "A9": true,
		"": false, "-x": false, ".hidden": false, "../etc": false, "a/b": false, "a b": false,
		string(make([]byte, 129)): false,
	} {
		if got := vminit.ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}
