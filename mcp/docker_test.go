package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/internal/testbin"
	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/mcp"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// project is one checkout with its sandbox, shared by the Docker tests of
// this package so the runner image is built once. TestMain removes its VM,
// volume and image.
type project struct {
	dir  string // the checkout
	root string // temp root holding the checkout and the XDG dirs
	m    *sandbox.Manager
	opts mcp.Options
}

var shared struct {
	once sync.Once
	p    *project
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if p := shared.p; p != nil {
		p.cleanup()
	}
	os.Exit(code)
}

// dockerProject returns the shared project (agent "shell", network mode
// "open", the local debian:bookworm-slim base), skipping without Docker.
func dockerProject(t *testing.T) *project {
	t.Helper()
	testenv.RequireDocker(t)
	base := testenv.BaseImage(t)
	bin := os.Getenv("AGENTS_SANDBOX_BIN") // a prebuilt static binary, if the caller has one
	if bin == "" {
		bin = testbin.Path(t)
	}
	shared.once.Do(func() { shared.p, shared.err = newProject(t, base, bin, "") })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.p
}

// ownProject is a project of one test with its own Dockerfile, removed when
// the test ends.
func ownProject(t *testing.T, dockerfile string) *project {
	t.Helper()
	testenv.RequireDocker(t)
	base := testenv.BaseImage(t)
	bin := os.Getenv("AGENTS_SANDBOX_BIN")
	if bin == "" {
		bin = testbin.Path(t)
	}
	p, err := newProject(t, base, bin, dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cleanup)
	return p
}

// newProject makes a checkout (agent shell, network mode open, trusted)
// with dockerfile as its .agents-sandbox/Dockerfile when not empty.
func newProject(t *testing.T, base, bin, dockerfile string) (*project, error) {
	root, err := os.MkdirTemp("", "agents-sandbox-mcp-test-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "checkout")
	if err := os.MkdirAll(filepath.Join(dir, ".agents-sandbox"), 0o755); err != nil {
		return nil, err
	}
	gittest.Init(t, dir)
	cfg := fmt.Sprintf("agent = \"shell\"\nidle_timeout = \"0\"\n[image]\nbase = %q\n[network]\nmode = \"open\"\n", base)
	if err := os.WriteFile(filepath.Join(dir, ".agents-sandbox", "config.toml"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if dockerfile != "" {
		if err := os.WriteFile(filepath.Join(dir, ".agents-sandbox", "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
			return nil, err
		}
	}
	gittest.Commit(t, dir, "README.md", "hello\n", "initial")
	dirs := sandbox.Dirs{Config: filepath.Join(root, "config"), State: filepath.Join(root, "state"), Cache: filepath.Join(root, "cache")}
	log := testLogger(t).Level(100) // the shared project outlives the first test's logger
	ctx := context.Background()
	rt, err := docker.New(ctx, docker.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	m, err := sandbox.NewManager(rt, dirs, log)
	if err != nil {
		return nil, err
	}
	m.InitBinary = bin
	m.Environ = []string{"HOME=" + root, "PATH=" + os.Getenv("PATH")}
	// The user accepts the project's network.mode = "open".
	if _, err := m.Open(sandbox.OpenOptions{Dir: dir, Trust: true}); err != nil {
		return nil, err
	}
	opts := mcp.Options{Registry: tools.All(tools.Deps{Core: m, Log: log}), Schema: schemaFromDisk, Log: log, Version: "test"}
	return &project{dir: dir, root: root, m: m, opts: opts}, nil
}

// cleanup removes the project's VM, home volume, proxy, network and runner
// image (by its checkout label), and its temp dirs.
func (p *project) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if pr, err := p.m.Open(sandbox.OpenOptions{Dir: p.dir}); err == nil {
		if _, err := p.m.Remove(ctx, pr, true); err != nil {
			fmt.Fprintf(os.Stderr, "cleanup: remove sandbox: %v\n", err)
		}
		removeRunnerImages(ctx, p.m.RT, pr.ID.CheckoutSlug)
	}
	os.RemoveAll(p.root)
}

// removeRunnerImages removes the runner images of one checkout (found by
// its labels; Prune keeps images younger than ten minutes).
func removeRunnerImages(ctx context.Context, rt sandbox.Runtime, slug string) {
	imgs, err := rt.ListImages(ctx, map[string]string{sandbox.LabelCheckout: slug, sandbox.LabelKind: string(sandbox.KindRunner)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "cleanup: list images: %v\n", err)
		return
	}
	for _, img := range imgs {
		for _, ref := range append(append([]string{}, img.Tags...), img.ID) {
			if err := rt.RemoveImage(ctx, ref); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				fmt.Fprintf(os.Stderr, "cleanup: remove image %s: %v\n", ref, err)
			}
		}
	}
}

// processesIn counts processes in the VM whose command line matches the
// grep regex re (write "[s]leep 300" so that the search's own command line,
// which holds the regex, does not match).
func processesIn(t *testing.T, p *project, re string) int {
	t.Helper()
	pr, err := p.m.Open(sandbox.OpenOptions{Dir: p.dir})
	if err != nil {
		t.Fatal(err)
	}
	script := `n=0; for f in /proc/[0-9]*/cmdline; do if tr '\0' ' ' <"$f" 2>/dev/null | grep -q -- "$0"; then n=$((n+1)); fi; done; echo $n`
	r, err := p.m.Exec(context.Background(), pr, sandbox.ExecOptions{Cmd: []string{"sh", "-c", script, re}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscan(r.Stdout.Text, &n); err != nil {
		t.Fatalf("count processes: %q %q", r.Stdout.Text, r.Stderr.Text)
	}
	return n
}

// waitNoProcess waits until no process in the VM matches the regex re.
func waitNoProcess(t *testing.T, p *project, re string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := processesIn(t, p, re)
		if n <= 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes matching %q still run in the VM 30 s after the cancel", n, re)
		}
	}
}
