package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// procMem is a process's resident memory as /proc/PID/status reports it, in
// bytes.
type procMem struct {
	RSS int64 // VmRSS: resident now
	HWM int64 // VmHWM: the peak resident set size since the process started
}

// readProcMem reads VmRSS and VmHWM of pid ("self" for this process).
func readProcMem(pid string) (procMem, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return procMem{}, fmt.Errorf("read memory of process %s: %w", pid, err)
	}
	defer f.Close()
	var m procMem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return procMem{}, fmt.Errorf("read memory of process %s: %s: %w", pid, k, err)
		}
		*dst = kb * 1024
	}
	if err := sc.Err(); err != nil {
		return procMem{}, fmt.Errorf("read memory of process %s: %w", pid, err)
	}
	if m.HWM == 0 {
		return procMem{}, fmt.Errorf("read memory of process %s: no VmHWM line", pid)
	}
	return m, nil
}

// selfPeakMiB is this process's own peak RSS (VmHWM) in MiB.
func selfPeakMiB() float64 {
	m, err := readProcMem("self")
	if err != nil {
		return 0
	}
	return mib(m.HWM)
}

// rusageMaxRSS is ru_maxrss of an exited child in bytes (the kernel reports
// KiB). It covers the child and the descendants it waited for.
func rusageMaxRSS(ps *os.ProcessState) int64 {
	if ps == nil {
		return 0
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0
	}
	return ru.Maxrss * 1024
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// runCmd runs name args with stdout and stderr captured and fails with both
// quoted when it exits non-zero.
func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
