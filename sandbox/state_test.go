package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// helperEnv selects a helper mode when the test binary re-executes itself
// (see TestMain). It deliberately does not start with AGENTS_SANDBOX_, which
// LoadConfig would reject as an unknown setting.
const helperEnv = "SANDBOX_TEST_HELPER"

// TestMain runs a helper mode instead of the tests when helperEnv is set:
// the state and lock tests need real, separately killable processes.
func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := runHelper(mode); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", mode, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runHelper is the body of a helper process. Parameters come from
// SANDBOX_TEST_* variables; progress lines go to stdout.
func runHelper(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lockPath := os.Getenv("SANDBOX_TEST_LOCK")
	switch mode {
	case "lock-append":
		// Wait for the start signal so that both racers begin together.
		if _, err := os.Stdin.Read(make([]byte, 1)); err != nil {
			return fmt.Errorf("read start signal: %w", err)
		}
		id, other := os.Getenv("SANDBOX_TEST_ID"), os.Getenv("SANDBOX_TEST_OTHER")
		n, _ := strconv.Atoi(os.Getenv("SANDBOX_TEST_N"))
		dir := filepath.Dir(os.Getenv("SANDBOX_TEST_OUT"))
		for i := range n {
			// Announce that we want the lock; the holder releases it only
			// once the other racer wants it too, so every release is a race.
			if err := os.WriteFile(filepath.Join(dir, "want-"+id), nil, 0o600); err != nil {
				return err
			}
			l, err := acquireForRace(ctx, lockPath, i)
			if err != nil {
				return err
			}
			if err := os.Remove(filepath.Join(dir, "want-"+id)); err != nil {
				return err
			}
			f, err := os.OpenFile(os.Getenv("SANDBOX_TEST_OUT"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return err
			}
			// One write per line: without the lock, the other process's
			// lines would land in between.
			lines := []string{fmt.Sprintf("%s start %d\n", id, i)}
			for j := range raceBody {
				lines = append(lines, fmt.Sprintf("%s body %d %d\n", id, i, j))
			}
			lines = append(lines, fmt.Sprintf("%s end %d\n", id, i))
			for _, line := range lines {
				if _, err := f.WriteString(line); err != nil {
					return err
				}
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := waitForOther(ctx, dir, other); err != nil {
				return err
			}
			if err := l.Unlock(); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(dir, "done-"+id), nil, 0o600)
	case "lock-hold":
		if _, err := sandbox.AcquireLock(ctx, lockPath); err != nil {
			return err
		}
		fmt.Println("locked")
		_, err := io.Copy(io.Discard, os.Stdin) // hold until killed
		return err
	case "lock-hold-spawn":
		// Hold the lock and start a long-lived child, as the VM lifecycle
		// does with attach sessions: the child must not inherit the lock.
		if _, err := sandbox.AcquireLock(ctx, lockPath); err != nil {
			return err
		}
		child := exec.Command(os.Args[0])
		child.Env = append(os.Environ(), helperEnv+"=block")
		child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			return err
		}
		_, err := io.Copy(io.Discard, os.Stdin)
		return err
	case "block":
		fmt.Printf("child %d\n", os.Getpid())
		_, err := io.Copy(io.Discard, os.Stdin)
		return err
	case "write-interrupted":
		stopAt, _ := strconv.Atoi(os.Getenv("SANDBOX_TEST_STOP_AT"))
		data := bytes.Repeat([]byte("x"), 1<<20)
		return sandbox.WriteFileAtomicHooked(os.Getenv("SANDBOX_TEST_OUT"), data, 0o600, func(written int) {
			if written >= stopAt {
				fmt.Printf("written %d\n", written)
				_, _ = io.Copy(io.Discard, os.Stdin) // wait to be killed
				os.Exit(3)                           // stdin closed: never finish the write
			}
		})
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

// acquireForRace takes the lock by spinning on TryLock on even turns and
// with AcquireLock on odd ones: AcquireLock alone polls every 50 ms, and the
// holder would win the lock back each time before the other looked.
func acquireForRace(ctx context.Context, path string, turn int) (*sandbox.Lock, error) {
	if turn%2 == 1 {
		return sandbox.AcquireLock(ctx, path)
	}
	for ctx.Err() == nil {
		l, ok, err := sandbox.TryLock(path)
		if err != nil || ok {
			return l, err
		}
		runtime.Gosched()
	}
	return nil, ctx.Err()
}

// waitForOther spins until the other racer wants the lock or is done.
func waitForOther(ctx context.Context, dir, other string) error {
	for ctx.Err() == nil {
		for _, f := range []string{"want-" + other, "done-" + other} {
			if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
				return nil
			}
		}
		runtime.Gosched()
	}
	return ctx.Err()
}

// proc is a running helper process.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startHelper starts the test binary in a helper mode. The process is killed
// and reaped at the end of the test if it is still running.
func startHelper(t *testing.T, mode string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	// A file, not a buffer: Wait would otherwise wait for every process
	// holding the pipe, including a grandchild that outlives the helper.
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if b, _ := os.ReadFile(stderr.Name()); t.Failed() && len(b) > 0 {
			t.Logf("helper %s stderr:\n%s", mode, b)
		}
	})
	return p
}

// expect reads the helper's next line and checks its prefix.
func (p *proc) expect(t *testing.T, prefix string) string {
	t.Helper()
	line, err := p.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, prefix) {
		t.Fatalf("helper said %q, %v; want a line starting with %q", line, err, prefix)
	}
	return strings.TrimSpace(line)
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := p.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die of SIGKILL: %v", err)
	}
}

// raceBody is the number of body lines a racer writes per turn.
const raceBody = 50

// TestLockRace: two processes take turns on one lock, each appending a block
// of lines per turn; no block is ever interleaved with the other's.
func TestLockRace(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	lock := sandbox.LockFile(dir, "vm")
	out := filepath.Join(dir, "out.txt")
	const n = 200
	var procs []*proc
	for _, ids := range [][2]string{{"A", "B"}, {"B", "A"}} {
		procs = append(procs, startHelper(t, "lock-append", "SANDBOX_TEST_LOCK="+lock, "SANDBOX_TEST_OUT="+out,
			"SANDBOX_TEST_ID="+ids[0], "SANDBOX_TEST_OTHER="+ids[1], "SANDBOX_TEST_N="+strconv.Itoa(n)))
	}
	for _, p := range procs {
		if _, err := p.stdin.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("racer: %v", err)
		}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	const block = raceBody + 2
	if len(lines) != 2*n*block {
		t.Fatalf("%d lines, want %d", len(lines), 2*n*block)
	}
	next := map[string]int{}
	switches := 0
	for b := 0; b < len(lines); b += block {
		id, _, _ := strings.Cut(lines[b], " ")
		i := next[id]
		want := []string{fmt.Sprintf("%s start %d", id, i)}
		for j := range raceBody {
			want = append(want, fmt.Sprintf("%s body %d %d", id, i, j))
		}
		want = append(want, fmt.Sprintf("%s end %d", id, i))
		if got := lines[b : b+block]; !reflect.DeepEqual(got, want) {
			t.Fatalf("block at line %d is interleaved or out of order:\n%s", b+1, strings.Join(got, "\n"))
		}
		next[id]++
		if b > 0 && !strings.HasPrefix(lines[b-1], id+" ") {
			switches++
		}
	}
	t.Logf("%d blocks, the lock changed hands %d times", 2*n, switches)
}

// TestLockReleasedWhenHolderKilled: a process SIGKILLed while holding the
// lock leaves it free at once.
func TestLockReleasedWhenHolderKilled(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	lock := sandbox.LockFile(dir, "vm")
	p := startHelper(t, "lock-hold", "SANDBOX_TEST_LOCK="+lock)
	p.expect(t, "locked")

	if l, ok, err := sandbox.TryLock(lock); err != nil || ok {
		l.Unlock()
		t.Fatalf("TryLock while another process holds it = %v, %v; want false", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := sandbox.AcquireLock(ctx, lock)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), lock) {
		t.Fatalf("AcquireLock while held: err = %v, want a deadline error naming the lock", err)
	}

	p.kill(t)
	// Free as soon as the holder is reaped: no polling needed.
	l, ok, err := sandbox.TryLock(lock)
	if err != nil || !ok {
		t.Fatalf("TryLock after the holder was killed = %v, %v; want true", ok, err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err = sandbox.AcquireLock(ctx, lock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("AcquireLock after the kill took %v", time.Since(start))
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Errorf("second Unlock: %v", err)
	}
}

// TestLockNotInheritedByChildren: a long-lived child started by the holder
// does not keep the lock once the holder is killed.
func TestLockNotInheritedByChildren(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	lock := sandbox.LockFile(dir, "vm")
	p := startHelper(t, "lock-hold-spawn", "SANDBOX_TEST_LOCK="+lock)
	line := p.expect(t, "child ")
	pid, err := strconv.Atoi(strings.TrimPrefix(line, "child "))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // the grandchild this test started
	if _, ok, _ := sandbox.TryLock(lock); ok {
		t.Fatal("lock free while the helper holds it")
	}
	p.kill(t)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("grandchild %d is gone (%v); the test needs it alive", pid, err)
	}
	l, ok, err := sandbox.TryLock(lock)
	if err != nil || !ok {
		t.Fatalf("TryLock with the holder dead and its child alive = %v, %v; want true", ok, err)
	}
	l.Unlock()
}

// TestWriteInterrupted: a process killed in the middle of an atomic state
// write, or after writing everything but before the rename, leaves the old
// state file intact and loadable; its temp file is never read as state.
func TestWriteInterrupted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		stopAt int
	}{
		{"after the first chunk", 1},
		{"after the last chunk, before rename", 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := tempDir(t)
			old := &sandbox.State{}
			old.Agent("opencode").VM = "app-0123-opencode"
			old.Agent("opencode").Provisioned = map[string]string{".gitconfig": "abc"}
			if err := sandbox.SaveState(dir, old); err != nil {
				t.Fatal(err)
			}
			before, err := os.ReadFile(sandbox.StateFile(dir))
			if err != nil {
				t.Fatal(err)
			}

			p := startHelper(t, "write-interrupted", "SANDBOX_TEST_OUT="+sandbox.StateFile(dir), "SANDBOX_TEST_STOP_AT="+strconv.Itoa(c.stopAt))
			p.expect(t, "written ")
			temps, err := filepath.Glob(filepath.Join(dir, ".state.json.tmp-*"))
			if err != nil || len(temps) != 1 {
				t.Fatalf("temp files mid-write = %v, %v; want one", temps, err)
			}
			fi, err := os.Stat(temps[0])
			if err != nil || fi.Size() == 0 {
				t.Fatalf("temp file %v: %v; want partly written", fi, err)
			}
			p.kill(t)

			after, err := os.ReadFile(sandbox.StateFile(dir))
			if err != nil || !bytes.Equal(after, before) {
				t.Fatalf("state file after the killed write differs (%v):\n%s", err, after)
			}
			got, err := sandbox.LoadState(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Agents, old.Agents) {
				t.Errorf("LoadState after the killed write = %+v, want the old state %+v", got.Agents, old.Agents)
			}
			if temps, _ := filepath.Glob(filepath.Join(dir, ".state.json.tmp-*")); len(temps) != 1 {
				t.Errorf("temp files = %v; want the killed writer's one left", temps)
			}
			// The next write goes through and is what loads.
			got.Agent("opencode").VM = "new"
			if err := sandbox.SaveState(dir, got); err != nil {
				t.Fatal(err)
			}
			again, err := sandbox.LoadState(dir)
			if err != nil || again.Agent("opencode").VM != "new" {
				t.Fatalf("LoadState after a new save = %+v, %v", again, err)
			}
		})
	}
}

func TestStateRoundTrip(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(tempDir(t), "state", "app-0123")
	s, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != sandbox.StateVersion || len(s.Agents) != 0 {
		t.Fatalf("LoadState of a missing file = %+v, want empty at the current version", s)
	}
	a := s.Agent("claude-code")
	a.HomeVolume = "app-0123-claude-code-20240102T030405Z"
	a.CreatedAt = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	a.Placeholders = map[string]string{"GH_TOKEN": "placeholder-1"}
	if err := sandbox.SaveState(dir, s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sandbox.StateFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode = %v, want 0600", fi.Mode().Perm())
	}
	if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode = %v, %v; want 0700", di.Mode().Perm(), err)
	}
	got, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Agents, s.Agents) || got.UpdatedAt.IsZero() || got.Version != sandbox.StateVersion {
		t.Errorf("round trip = %+v, want %+v", got, s)
	}
	if temps, _ := filepath.Glob(filepath.Join(dir, ".state.json.tmp-*")); len(temps) != 0 {
		t.Errorf("temp files left after a good save: %v", temps)
	}
}

func TestLoadStateRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, content, msg string
	}{
		{"newer version", `{"version": 2, "agents": {}}`, "newer than this agents-sandbox understands"},
		{"much newer version", `{"version": 99}`, "version 99"},
		{"garbage", "not json at all", "corrupt"},
		{"truncated", `{"version": 1, "agents": {"x": {"vm": "ap`, "corrupt"},
		{"empty", "", "corrupt"},
		{"zeroed", "\x00\x00\x00\x00", "corrupt"},
		{"wrong shape", `{"version": 1, "agents": []}`, "corrupt"},
		{"array", `[1, 2]`, "corrupt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := tempDir(t)
			if err := os.WriteFile(sandbox.StateFile(dir), []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := sandbox.LoadState(dir)
			if err == nil || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), sandbox.StateFile(dir)) {
				t.Fatalf("LoadState = %+v, %v; want an error naming the file and saying %q", s, err, c.msg)
			}
			// A refused file is left alone.
			if b, _ := os.ReadFile(sandbox.StateFile(dir)); string(b) != c.content {
				t.Errorf("state file changed to %q", b)
			}
		})
	}
}

func TestLoadStateOldVersion(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	data, _ := json.Marshal(map[string]any{"agents": map[string]any{"x": map[string]any{"vm": "v"}}})
	if err := os.WriteFile(sandbox.StateFile(dir), data, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := sandbox.LoadState(dir)
	if err != nil || s.Version != sandbox.StateVersion || s.Agent("x").VM != "v" {
		t.Fatalf("LoadState of a version-less file = %+v, %v", s, err)
	}
}

func TestWriteFileAtomicErrors(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The parent is a file: no directory can be made.
	if err := sandbox.WriteFileAtomic(filepath.Join(blocker, "x"), []byte("x"), 0o600); err == nil || !strings.Contains(err.Error(), blocker) {
		t.Errorf("WriteFileAtomic under a file: err = %v", err)
	}
	// The target is a directory: the rename fails and no temp file stays.
	target := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.WriteFileAtomic(target, []byte("x"), 0o600); err == nil || !strings.Contains(err.Error(), "rename") {
		t.Errorf("WriteFileAtomic over a directory: err = %v", err)
	}
	if temps, _ := filepath.Glob(filepath.Join(dir, ".d.tmp-*")); len(temps) != 0 {
		t.Errorf("temp files left after a failed write: %v", temps)
	}
	// Lock files under a file cannot be made either.
	if _, err := sandbox.AcquireLock(context.Background(), filepath.Join(blocker, "x.lock")); err == nil {
		t.Error("AcquireLock under a file succeeded")
	}
	if _, _, err := sandbox.TryLock(filepath.Join(blocker, "x.lock")); err == nil {
		t.Error("TryLock under a file succeeded")
	}
}
