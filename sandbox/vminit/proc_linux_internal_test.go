//go:build linux

package vminit

import (
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	rest := " 0 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 100 18446744073709551615"
	tests := []struct {
		name, in string
		want     procStat
		wantErr  bool
	}{
		{"plain", "42 (sleep) S 7 42" + rest, procStat{PID: 42, State: 'S', PPID: 7, PGRP: 42, StartTicks: 12345}, false},
		{"spaces and parens in comm", "9 (a) b (c)) Z 1 3" + rest, procStat{PID: 9, State: 'Z', PPID: 1, PGRP: 3, StartTicks: 12345}, false},
		{"truncated", "9 (x) S 1 3 0 0", procStat{}, true},
		{"no comm", "9 x S 1 3" + rest, procStat{}, true},
		{"bad ppid", "9 (x) S p 3" + rest, procStat{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseProcStat([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseProcStat(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("parseProcStat(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestReadProcStatSelf(t *testing.T) {
	t.Parallel()
	st, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != os.Getpid() || st.PPID != os.Getppid() || st.StartTicks == 0 || st.State == 'Z' {
		t.Errorf("readProcStat(self) = %+v; pid %d ppid %d", st, os.Getpid(), os.Getppid())
	}
	if !sameProcess(st.PID, st.StartTicks) || sameProcess(st.PID, st.StartTicks+1) {
		t.Error("sameProcess does not tell start times apart")
	}
}

func TestDescendants(t *testing.T) {
	t.Parallel()
	all := []procStat{{PID: 1}, {PID: 10, PPID: 1}, {PID: 11, PPID: 10}, {PID: 12, PPID: 11}, {PID: 20, PPID: 1}, {PID: 30, PPID: 99}}
	got := descendants(all, 10)
	if len(got) != 2 || got[0].PID != 11 || got[1].PID != 12 {
		t.Errorf("descendants(10) = %+v, want pids 11, 12", got)
	}
}

func TestSummarizeCmd(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 200) // 400 bytes
	got := summarizeCmd([]string{"claude", "-p", long})
	if len(got) != 3 || got[0] != "claude" || len(got[2]) > maxCmdArgLen+len("…") || !strings.HasSuffix(got[2], "…") || !utf8.ValidString(got[2]) {
		t.Errorf("summarizeCmd(long arg) = %q", got)
	}
	many := make([]string, 40)
	got = summarizeCmd(many)
	if len(got) != maxCmdArgs+1 || got[maxCmdArgs] != "… (8 more)" {
		t.Errorf("summarizeCmd(40 args) has %d entries, last %q", len(got), got[len(got)-1])
	}
}
