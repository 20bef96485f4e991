//go:build linux

package vminit_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit"
)

// vmBinary is where the host copies the agents-sandbox binary in every VM.
const vmBinary = "/usr/local/lib/agents-sandbox/agents-sandbox"

// TestInDocker runs the static helper binary as the entrypoint (PID 1) of a
// busybox container, as the VM does, and drives it with docker exec.
func TestInDocker(t *testing.T) {
	testenv.RequireDocker(t)
	image := testenv.BusyboxImage(t)
	bin := buildStaticHelper(t)
	runID := randomHex(t)

	for _, tt := range []struct {
		name  string
		extra []string // docker create options
	}{
		{"idle timeout stops the container", nil},
		// Init as an unprivileged user can only keep its run dir on a tmpfs
		// the user can write (the recommended setup either way).
		{"idle timeout as uid 1000 with a tmpfs run dir", []string{"--user", "1000:1000", "--tmpfs", vminit.DefaultRunDir + ":mode=1777"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := startContainer(t, image, bin, runID, tt.extra, "vm-init", "--idle-timeout", "3s", "--tick", "500ms")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if out, stderr, code := docker(ctx, t, "exec", id, vmBinary, "vm-exec", "--", "id", "-u"); code != 0 {
				t.Errorf("exec: exit %d, %s%s", code, out, stderr)
			}
			out, stderr, code := docker(ctx, t, "wait", id)
			if code != 0 || strings.TrimSpace(out) != "0" {
				t.Fatalf("docker wait: exit %d, container exit %q, %s", code, out, stderr)
			}
			var state struct{ StartedAt, FinishedAt time.Time }
			inspect(t, id, "{{json .State}}", &state)
			if ran := state.FinishedAt.Sub(state.StartedAt); ran < 3*time.Second {
				t.Errorf("the container ran %v, less than the 3s idle timeout", ran)
			}
			logs, logErr, _ := docker(ctx, t, "logs", id)
			if !strings.Contains(logs+logErr, `"idle timeout"`) || !strings.Contains(logs+logErr, `"watchdog":true`) {
				t.Errorf("container log lacks the watchdog or the idle timeout: %s%s", logs, logErr)
			}
		})
	}

	t.Run("exec, orphans, timeout and stop", func(t *testing.T) {
		t.Parallel()
		id := startContainer(t, image, bin, runID, nil, "vm-init", "--idle-timeout", "0", "--grace", "3s")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		vmExec := func(args ...string) (string, string, int) {
			return docker(ctx, t, append([]string{"exec", id, vmBinary, "vm-exec", "--"}, args...)...)
		}

		var st vminit.Status
		waitFor(t, "the status file", func() bool {
			out, _, code := docker(ctx, t, "exec", id, "cat", vminit.StatusFile(""))
			return code == 0 && json.Unmarshal([]byte(out), &st) == nil
		})
		if st.PID != 1 || st.State != vminit.InitRunning || st.Watchdog {
			t.Errorf("status %+v, want pid 1, running, no watchdog", st)
		}

		if _, stderr, code := vmExec("sh", "-c", "echo out; echo err >&2; exit 7"); code != 7 || stderr != "err\n" {
			t.Errorf("exit 7: got exit %d, stderr %q", code, stderr)
		}
		// Init runs as root, commands as the unprivileged user.
		if _, stderr, code := docker(ctx, t, "exec", "--user", "1000:1000", id, vmBinary, "vm-exec", "--", "sh", "-c", "exit 5"); code != 5 {
			t.Errorf("exit 5 as uid 1000: got exit %d, stderr %q", code, stderr)
		}
		if _, stderr, code := vmExec("no-such-command-x9"); code != vminit.ExitNotFound ||
			!strings.Contains(stderr, "agents-sandbox: no-such-command-x9: command not found") {
			t.Errorf("missing command: exit %d, stderr %q", code, stderr)
		}

		orphans := `for i in $(seq 100); do (sleep 0.1 &) ; done`
		// Straight through docker exec: the orphans go to PID 1, our init.
		if _, stderr, code := docker(ctx, t, "exec", id, "sh", "-c", orphans); code != 0 {
			t.Fatalf("orphans: exit %d, %s", code, stderr)
		}
		// Through the wrapper: it reaps them itself.
		if _, stderr, code := vmExec("sh", "-c", orphans); code != 0 {
			t.Fatalf("orphans under vm-exec: exit %d, %s", code, stderr)
		}
		var ps []containerProc
		waitFor(t, "every sleep to end with no zombie left", func() bool {
			ps = containerProcs(ctx, t, id)
			for _, p := range ps {
				if p.State == 'Z' || p.Comm == "sleep" {
					return false
				}
			}
			return true
		})

		began := time.Now()
		if _, stderr, code := docker(ctx, t, "exec", id, vmBinary, "vm-exec", "--timeout", "1s", "--",
			"sh", "-c", "sleep 1000 & sleep 1000"); code != vminit.ExitTimeout {
			t.Errorf("timeout: exit %d, stderr %q", code, stderr)
		}
		t.Logf("timed-out exec returned after %v", time.Since(began).Round(time.Millisecond))
		for _, p := range containerProcs(ctx, t, id) {
			if p.Comm == "sleep" || p.State == 'Z' {
				t.Errorf("left after the timeout: %+v", p)
			}
		}
		if _, _, code := vmExec("true"); code != 0 {
			t.Errorf("exec after the timeout: exit %d", code)
		}

		// A live session, then docker stop: init ends it and exits 0 well
		// before docker's own SIGKILL.
		detached := exec.CommandContext(ctx, "docker", "exec", id, vmBinary, "vm-exec", "--id", "long", "--", "sleep", "1000")
		if err := detached.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the long session", func() bool {
			_, _, code := docker(ctx, t, "exec", id, "test", "-e", filepath.Join(vminit.SessionsDir(""), "long.pid"))
			return code == 0
		})
		began = time.Now()
		if _, stderr, code := docker(ctx, t, "stop", "--time", "30", id); code != 0 {
			t.Fatalf("docker stop: %s", stderr)
		}
		took := time.Since(began)
		var state struct{ ExitCode int }
		inspect(t, id, "{{json .State}}", &state)
		if state.ExitCode != 0 || took > 20*time.Second {
			t.Errorf("docker stop took %v, exit code %d; want a clean exit 0 before the 30s SIGKILL", took, state.ExitCode)
		}
		if err := detached.Wait(); err == nil || detached.ProcessState.ExitCode() != 143 {
			t.Errorf("the session's docker exec ended with %v, want exit 143", err)
		}
	})
}

// buildStaticHelper builds internal/cmd/vmhelper with CGO_ENABLED=0 and checks
// the result has no ELF interpreter (it runs on any Linux userland).
func buildStaticHelper(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agents-sandbox")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./internal/cmd/vmhelper")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the helper: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked", bin)
		}
	}
	return bin
}

// startContainer creates a labelled container running the helper as its
// entrypoint with args, copies the helper in (as the host's CopyTo does) and
// starts it. extra are more docker create options. It is removed at cleanup.
func startContainer(t *testing.T, image, bin, runID string, extra []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	create := append([]string{"create",
		"--label", "org.agents-sandbox.test=vminit",
		"--label", "org.agents-sandbox.test-run=" + runID,
		"--network", "none", "--entrypoint", vmBinary}, extra...)
	create = append(append(create, image), args...)
	out, stderr, code := docker(ctx, t, create...)
	if code != 0 {
		t.Fatalf("docker create: %s", stderr)
	}
	id := strings.TrimSpace(out)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, stderr, code := docker(ctx, t, "rm", "-f", id); code != 0 {
			t.Errorf("remove container %s: %s", id, stderr)
		}
	})
	cp := exec.CommandContext(ctx, "docker", "cp", "-", id+":/")
	cp.Stdin = binaryTar(t, bin)
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("docker cp: %v: %s", err, out)
	}
	if _, stderr, code := docker(ctx, t, "start", id); code != 0 {
		t.Fatalf("docker start: %s", stderr)
	}
	return id
}

// binaryTar is a tar stream holding bin at vmBinary with its directories.
func binaryTar(t *testing.T, bin string) *bytes.Buffer {
	t.Helper()
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/lib/", "usr/local/lib/agents-sandbox/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(vmBinary, "/"), Mode: 0o755, Size: int64(len(data))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// docker runs the docker CLI; code is its exit code (for exec: the command's).
func docker(ctx context.Context, t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("docker %v: %v", args, err)
	}
	return out.String(), errOut.String(), 0
}

func inspect(t *testing.T, id, format string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, stderr, code := docker(ctx, t, "inspect", "--format", format, id)
	if code != 0 {
		t.Fatalf("docker inspect: %s", stderr)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("parse docker inspect %q: %v", out, err)
	}
}

type containerProc struct {
	vminit.ProcStat
	Comm string
}

// containerProcs lists the container's processes from its /proc.
func containerProcs(ctx context.Context, t *testing.T, id string) []containerProc {
	t.Helper()
	// Processes that end while cat runs make it complain and go on.
	out, _, _ := docker(ctx, t, "exec", id, "sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null")
	var ps []containerProc
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		st, err := vminit.ParseProcStat([]byte(line))
		if err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		comm := line[strings.IndexByte(line, '(')+1 : strings.LastIndexByte(line, ')')]
		ps = append(ps, containerProc{st, comm})
	}
	return ps
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:]) + strconv.Itoa(os.Getpid())
}
