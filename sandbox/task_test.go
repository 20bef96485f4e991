package sandbox_test

// End-to-end tests of task sandboxes (issue 4) against the real engine:
// concurrent spawns, copy isolation and the returned diff, the workspace
// and home modes, env, output caps, exit codes, timeouts and keep. The
// helpers here (tk*) are shared with housekeeping_test.go and
// prune_test.go.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/internal/testbin"
	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

// tkConfig is the project config of these tests: the shell agent and no
// network (nothing here needs one, and "none" needs no trust).
const tkConfig = "agent = \"shell\"\n[network]\nmode = \"none\"\n"

// tkTimeout bounds each test.
const tkTimeout = 4 * time.Minute

// tkWarm serialises the first image build of these tests: once one build
// has filled the engine's layer cache, the others take seconds instead of
// each running apt-get at the same time.
var tkWarm struct {
	sync.Mutex
	done bool
}

// tkEnv is one test's Manager with its own XDG directories and host home.
type tkEnv struct {
	rt   *docker.Driver
	m    *sandbox.Manager
	bin  string // the static agents-sandbox binary (CLI and VM init)
	root string
	home string
	xdg  struct{ config, state, cache string }

	mu    sync.Mutex
	swept map[string]bool // checkout slugs with a registered sweep
}

// newTK connects to the engine (skipping without one) and returns a
// Manager whose config, state and home directories are the test's own.
func newTK(t *testing.T) *tkEnv {
	t.Helper()
	testenv.RequireDocker(t)
	testenv.BaseImage(t)
	testenv.RequireGit(t)
	e := &tkEnv{bin: testbin.Path(t), root: t.TempDir(), swept: map[string]bool{}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	rt, err := docker.New(ctx, docker.Options{Logger: log})
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	e.rt = rt
	e.home = filepath.Join(e.root, "home")
	e.xdg.config = filepath.Join(e.root, "xdg-config")
	e.xdg.state = filepath.Join(e.root, "xdg-state")
	e.xdg.cache = filepath.Join(e.root, "xdg-cache")
	for _, d := range []string{e.home, e.xdg.config, e.xdg.state, e.xdg.cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	uid, gid := sandbox.DevIDs(os.Getuid(), os.Getgid())
	e.m = &sandbox.Manager{
		RT: rt,
		Dirs: sandbox.Dirs{
			Config: filepath.Join(e.xdg.config, "agents-sandbox"),
			State:  filepath.Join(e.xdg.state, "agents-sandbox"),
			Cache:  filepath.Join(e.xdg.cache, "agents-sandbox"),
		},
		Log:        log,
		InitBinary: e.bin,
		Environ:    []string{"HOME=" + e.home, "PATH=" + os.Getenv("PATH")},
		HostUID:    uid,
		HostGID:    gid,
		RunAsRoot:  os.Getuid() == 0,
		Now:        time.Now,
	}
	return e
}

func tkCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), tkTimeout)
	t.Cleanup(cancel)
	return ctx
}

// checkout makes a git repository <root>/<name> with tkConfig and files
// (slash-separated paths; a value starting with "->" makes a symbolic
// link), commits everything and returns its path.
func (e *tkEnv) checkout(t *testing.T, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(e.root, name)
	gittest.Init(t, dir)
	tkWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), tkConfig, 0o644)
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		tkWrite(t, full, content, 0o644)
	}
	gittest.Git(t, dir, "add", "-A")
	gittest.Git(t, dir, "commit", "-q", "-m", "fixture")
	return dir
}

func tkWrite(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// open opens the project at dir (agent overrides the configured one when
// set) and registers a sweep of everything carrying its checkout's label.
func (e *tkEnv) open(t *testing.T, dir, agent string) *sandbox.Project {
	t.Helper()
	p, err := e.m.Open(sandbox.OpenOptions{Dir: dir, Agent: agent, Trust: true})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if slug := p.ID.CheckoutSlug; !e.swept[slug] {
		e.swept[slug] = true
		t.Cleanup(func() { tkSweep(t, e.rt, map[string]string{sandbox.LabelCheckout: slug}) })
	}
	return p
}

// tkSweep removes every VM, volume, network and image carrying labels. The
// checkout slug hashes the test's own temp dir, so a checkout label is the
// test's own.
func tkSweep(t *testing.T, rt *docker.Driver, labels map[string]string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vms, err := rt.ListVMs(ctx, labels)
	if err != nil {
		t.Errorf("cleanup: list VMs: %v", err)
	}
	for _, vm := range vms {
		if err := rt.RemoveVM(ctx, vm.Name, true); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cleanup: remove VM %s: %v", vm.Name, err)
		}
	}
	vols, err := rt.ListVolumes(ctx, labels)
	if err != nil {
		t.Errorf("cleanup: list volumes: %v", err)
	}
	for _, v := range vols {
		if err := rt.RemoveVolume(ctx, v.Name); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cleanup: remove volume %s: %v", v.Name, err)
		}
	}
	nets, err := rt.ListNetworks(ctx, labels)
	if err != nil {
		t.Errorf("cleanup: list networks: %v", err)
	}
	for _, n := range nets {
		if err := rt.RemoveNetwork(ctx, n.Name); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cleanup: remove network %s: %v", n.Name, err)
		}
	}
	imgs, err := rt.ListImages(ctx, labels)
	if err != nil {
		t.Errorf("cleanup: list images: %v", err)
	}
	for _, img := range imgs {
		var refs []string
		for _, tag := range img.Tags {
			if !strings.HasPrefix(tag, "<none>") { // an untagged image as the engine lists it
				refs = append(refs, tag)
			}
		}
		for _, ref := range append(refs, img.ID) {
			if err := rt.RemoveImage(ctx, ref); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("cleanup: remove image %s: %v", ref, err)
			}
		}
	}
}

// spawn runs a task and fails the test when it cannot run (not on a
// non-zero exit). The first spawn of the test process that builds the
// default image does so alone (tkWarm).
func (e *tkEnv) spawn(t *testing.T, p *sandbox.Project, o sandbox.TaskOptions) sandbox.TaskResult {
	t.Helper()
	e.warm(t)
	res, err := e.m.SpawnTask(tkCtx(t), p, o)
	if err != nil {
		t.Fatalf("SpawnTask %q: %v", o.Cmd, err)
	}
	return res
}

// warm makes sure one build of the default image finished in this test
// process before the caller builds its own (which then hits the cache).
func (e *tkEnv) warm(t *testing.T) {
	t.Helper()
	tkWarm.Lock()
	defer tkWarm.Unlock()
	if tkWarm.done {
		return
	}
	p := e.open(t, e.checkout(t, "warm", nil), "")
	if _, err := e.m.SpawnTask(tkCtx(t), p, sandbox.TaskOptions{Cmd: []string{"true"}, Workspace: sandbox.WorkspaceNone}); err != nil {
		t.Fatalf("warm-up task: %v", err)
	}
	tkWarm.done = true
}

// create runs Manager.Create (the project VM) and fails the test on error.
func (e *tkEnv) create(t *testing.T, p *sandbox.Project) sandbox.CreateResult {
	t.Helper()
	e.warm(t)
	res, err := e.m.Create(tkCtx(t), p, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create %s: %v", p.Names.VM, err)
	}
	return res
}

// sh runs a script in the project VM and returns its stdout; a non-zero
// exit fails the test.
func (e *tkEnv) sh(t *testing.T, p *sandbox.Project, script string) string {
	t.Helper()
	res, err := e.m.Exec(tkCtx(t), p, sandbox.ExecOptions{Cmd: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("Exec %q: %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d\nstdout: %s\nstderr: %s", script, res.ExitCode, res.Stdout.Text, res.Stderr.Text)
	}
	return res.Stdout.Text
}

// tasks lists the task sandboxes carrying the checkout's label.
func (e *tkEnv) tasks(t *testing.T, p *sandbox.Project) []sandbox.VM {
	t.Helper()
	vms, err := e.rt.ListVMs(tkCtx(t), map[string]string{sandbox.LabelCheckout: p.ID.CheckoutSlug, sandbox.LabelKind: string(sandbox.KindTask)})
	if err != nil {
		t.Fatal(err)
	}
	return vms
}

// cli runs the agents-sandbox binary in dir with the test's XDG dirs and
// returns its stdout, stderr and exit code.
func (e *tkEnv) cli(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := e.cliCmd(t, dir, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("agents-sandbox %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

func (e *tkEnv) cliCmd(t *testing.T, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(tkCtx(t), e.bin, args...)
	cmd.Dir = dir
	cmd.Env = []string{
		"HOME=" + e.home, "PATH=" + os.Getenv("PATH"),
		"XDG_CONFIG_HOME=" + e.xdg.config, "XDG_STATE_HOME=" + e.xdg.state, "XDG_CACHE_HOME=" + e.xdg.cache,
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		cmd.Env = append(cmd.Env, "DOCKER_HOST="+h)
	}
	return cmd
}

// tkWaitFor polls cond every 100 ms until it holds or d passes.
func tkWaitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, d, detail)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tkSnapshot describes every entry under dir, .git included: its mode
// (type and permission bits) and, for a file, the sha256 of its content,
// for a symbolic link, its target.
func tkSnapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().String()
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += " " + hex.EncodeToString(sum[:])
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return out
}

// tkSameSnapshot fails the test with the differences of two snapshots.
func tkSameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	var diffs []string
	for p, b := range before {
		if a, ok := after[p]; !ok {
			diffs = append(diffs, "gone: "+p)
		} else if a != b {
			diffs = append(diffs, fmt.Sprintf("changed: %s: %s -> %s", p, b, a))
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, "new: "+p)
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Errorf("%s changed:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// tkTree describes the files and links under dir as git sees them: the
// executable bit and content of each file, the target of each link;
// directories and anything inside a .git directory left out.
func tkTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[filepath.ToSlash(rel)] = "link " + target
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = fmt.Sprintf("file x=%v %q", info.Mode()&0o100 != 0, data)
		return nil
	})
	if err != nil {
		t.Fatalf("tree of %s: %v", dir, err)
	}
	return out
}

// tkTarTree describes a tar of a directory (as CopyFrom returns it) the way
// tkTree describes a directory.
func tkTarTree(t *testing.T, r io.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
		if name == "" || name == ".git" || strings.HasPrefix(name, ".git/") || strings.Contains(name, "/.git/") {
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = fmt.Sprintf("file x=%v %q", hdr.Mode&0o100 != 0, data)
		case tar.TypeLink:
			out[name] = out[strings.TrimPrefix(hdr.Linkname, "./")]
		case tar.TypeSymlink:
			out[name] = "link " + hdr.Linkname
		}
	}
}

// tkSameTree fails the test with the differences of two trees.
func tkSameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	var diffs []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			diffs = append(diffs, "missing: "+p)
		} else if g != w {
			diffs = append(diffs, fmt.Sprintf("%s: got %.80s, want %.80s", p, g, w))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, "extra: "+p)
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Errorf("%s:\n%s", what, strings.Join(diffs, "\n"))
	}
}

func TestTaskConcurrentSpawns(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "many", map[string]string{"shared.txt": "base\n"})
	p := e.open(t, dir, "")
	before := tkSnapshot(t, dir)
	e.warm(t)

	const n = 20
	results := make([]sandbox.TaskResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx := tkCtx(t)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every task rewrites the same file and adds its own: each must
			// see only the checkout, never another task's work.
			results[i], errs[i] = e.m.SpawnTask(ctx, p, sandbox.TaskOptions{
				Cmd: []string{"sh", "-c", `test "$(cat shared.txt)" = base && echo "$N" > shared.txt && echo "$N" > "task-$N.txt" && ls`},
				Env: map[string]string{"N": fmt.Sprint(i)},
			})
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent tasks took %s", n, time.Since(start).Round(time.Millisecond))

	names := map[string]int{}
	for i, res := range results {
		if errs[i] != nil {
			t.Errorf("task %d: %v", i, errs[i])
			continue
		}
		if res.ExitCode != 0 {
			t.Errorf("task %d (%s): exit %d: %s", i, res.Name, res.ExitCode, res.Stderr.Text)
		}
		if !strings.HasPrefix(res.Name, p.Names.TaskPrefix) || !sandbox.ValidDockerName(res.Name) {
			t.Errorf("task %d: name %q, want %s<unix-nanos>", i, res.Name, p.Names.TaskPrefix)
		}
		if j, dup := names[res.Name]; dup {
			t.Errorf("tasks %d and %d share the name %s", j, i, res.Name)
		}
		names[res.Name] = i
		want := []string{"shared.txt", fmt.Sprintf("task-%d.txt", i)}
		if !slices.Equal(res.Changed, want) {
			t.Errorf("task %d changed %q, want %q", i, res.Changed, want)
		}
		if !strings.Contains(res.Diff, fmt.Sprintf("+%d\n", i)) || res.Kept {
			t.Errorf("task %d: kept %v, diff:\n%s", i, res.Kept, res.Diff)
		}
	}
	if left := e.tasks(t, p); len(left) > 0 {
		t.Errorf("%d task sandboxes left behind, e.g. %s (%s)", len(left), left[0].Name, left[0].State)
	}
	tkSameSnapshot(t, "the host checkout", before, tkSnapshot(t, dir))
}

// tkIsolationScript changes the copy of the checkout in every way a diff
// can carry, and some it cannot (.git).
const tkIsolationScript = `set -e
echo appended >> sub/deep/f.txt
rm gone.txt
rm -r olddir
chmod +x run.sh
chmod -x tool.sh
printf 'changed\n' > "with space.txt"
printf '\000\001\002new binary\377\n' > bin.dat
printf 'caf\351 cr\350me\n' > latin1.txt
mkdir -p "new/deeper dir"
echo fresh > "new/deeper dir/file name.txt"
ln README.md hardlink.md
ln -s sub/deep/f.txt link-to-f
rm old-link && ln -s README.md old-link
echo more >> build.log
echo junk > .git/task-was-here
git config --file .git/config core.task-was-here true || true
`

func TestTaskCopyIsolation(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "iso", map[string]string{
		".gitignore":     "*.log\n",
		"sub/deep/f.txt": "a\nb\n",
		"with space.txt": "x\n",
		"bin.dat":        "\x00\x01binary\x00\xff\xfe",
		"latin1.txt":     "caf\xe9\n",
		"gone.txt":       "to be deleted\n",
		"olddir/a.txt":   "a\n",
		"olddir/b/c.txt": "c\n",
		"run.sh":         "#!/bin/sh\necho run\n",
		"tool.sh":        "#!/bin/sh\necho tool\n",
		"old-link":       "->sub",
	})
	if err := os.Chmod(filepath.Join(dir, "tool.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	gittest.Git(t, dir, "add", "-A")
	gittest.Git(t, dir, "commit", "-q", "-m", "tool.sh executable")
	// Not committed: an untracked file and an ignored one are part of the
	// checkout the task sees too.
	tkWrite(t, filepath.Join(dir, "untracked.txt"), "untracked\n", 0o600)
	tkWrite(t, filepath.Join(dir, "build.log"), "log\n", 0o644)
	p := e.open(t, dir, "")

	// A copy of the checkout as it is now, to apply the diff to later.
	pristine := filepath.Join(e.root, "pristine")
	if out, err := exec.Command("cp", "-a", dir, pristine).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	before := tkSnapshot(t, dir)

	res := e.spawn(t, p, sandbox.TaskOptions{Cmd: []string{"bash", "-c", tkIsolationScript}, Keep: true})
	if res.ExitCode != 0 {
		t.Fatalf("task: exit %d\nstdout: %s\nstderr: %s", res.ExitCode, res.Stdout.Text, res.Stderr.Text)
	}
	tkSameSnapshot(t, "the host checkout", before, tkSnapshot(t, dir))

	wantChanged := []string{
		"bin.dat", "build.log", "gone.txt", "hardlink.md", "latin1.txt", "link-to-f",
		"new/deeper dir/file name.txt", "old-link", "olddir/a.txt", "olddir/b/c.txt",
		"run.sh", "sub/deep/f.txt", "tool.sh", "with space.txt",
	}
	if !slices.Equal(res.Changed, wantChanged) {
		t.Errorf("Changed = %q\nwant      %q", res.Changed, wantChanged)
	}
	if res.Workspace != "copy" || res.DiffTruncated || !res.Kept {
		t.Errorf("workspace %q, diff truncated %v, kept %v; want copy, false, true", res.Workspace, res.DiffTruncated, res.Kept)
	}
	if strings.Contains(res.Diff, "task-was-here") {
		t.Errorf("the diff carries the task's changes under .git:\n%s", res.Diff)
	}
	// The two files that are not UTF-8 text travel as binary patches, so the
	// diff is valid UTF-8 and survives JSON.
	if !strings.Contains(res.Diff, "GIT binary patch") || !tkUTF8Valid(res.Diff) {
		t.Errorf("want binary patches and a valid UTF-8 diff; diff:\n%q", res.Diff)
	}

	// The diff applies cleanly to a copy of the checkout and gives exactly
	// the task's /workspace.
	patch := filepath.Join(e.root, "task.patch")
	tkWrite(t, patch, res.Diff, 0o644)
	gittest.Git(t, dir, "apply", "--check", patch)
	gittest.Git(t, pristine, "apply", patch)
	rc, err := e.rt.CopyFrom(tkCtx(t), res.Name, sandbox.Workspace+"/.")
	if err != nil {
		t.Fatalf("copy /workspace out of the kept task: %v", err)
	}
	want := tkTarTree(t, rc)
	rc.Close()
	tkSameTree(t, "the copy with the diff applied, against the task's /workspace", tkTree(t, pristine), want)
	if got := want["hardlink.md"]; got != fmt.Sprintf("file x=false %q", "# test\n") {
		t.Errorf("task's hardlink.md: %s", got)
	}
}

func tkUTF8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestTaskWorkspaceModes(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "modes", map[string]string{"in.txt": "host\n"})
	p := e.open(t, dir, "")

	t.Run("mount", func(t *testing.T) {
		res := e.spawn(t, p, sandbox.TaskOptions{
			Cmd:       []string{"sh", "-c", "cat in.txt && echo from-task > out.txt"},
			Workspace: sandbox.WorkspaceMount,
		})
		if res.ExitCode != 0 || res.Stdout.Text != "host\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout.Text, res.Stderr.Text)
		}
		got, err := os.ReadFile(filepath.Join(dir, "out.txt"))
		if err != nil || string(got) != "from-task\n" {
			t.Errorf("host out.txt: %q, %v; want the task's write", got, err)
		}
		if res.Workspace != "mount" || res.Diff != "" || res.Changed != nil {
			t.Errorf("workspace %q, changed %q, diff %q; want mount and no diff", res.Workspace, res.Changed, res.Diff)
		}
	})
	t.Run("none", func(t *testing.T) {
		before := tkSnapshot(t, dir)
		res := e.spawn(t, p, sandbox.TaskOptions{
			Cmd:       []string{"sh", "-c", "pwd; ls -A /workspace; echo x > /workspace/new.txt"},
			Workspace: sandbox.WorkspaceNone,
		})
		if res.ExitCode != 0 || res.Stdout.Text != "/workspace\n" {
			t.Errorf("exit %d, stdout %q (want only the working directory: /workspace empty), stderr %q", res.ExitCode, res.Stdout.Text, res.Stderr.Text)
		}
		if res.Workspace != "none" || res.Diff != "" || res.Changed != nil {
			t.Errorf("workspace %q, changed %q, diff %q; want none and no diff", res.Workspace, res.Changed, res.Diff)
		}
		tkSameSnapshot(t, "the host checkout", before, tkSnapshot(t, dir))
	})
	t.Run("from a subdirectory", func(t *testing.T) {
		tkWrite(t, filepath.Join(dir, "sub", "deep", "here.txt"), "here\n", 0o644)
		ps, err := e.m.Open(sandbox.OpenOptions{Dir: filepath.Join(dir, "sub", "deep")})
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			ws   sandbox.WorkspaceMode
			want string
		}{
			{sandbox.WorkspaceCopy, "/workspace/sub/deep here.txt\n"},
			{sandbox.WorkspaceMount, "/workspace/sub/deep here.txt\n"},
			{sandbox.WorkspaceNone, "/workspace \n"},
		} {
			res := e.spawn(t, ps, sandbox.TaskOptions{Cmd: []string{"sh", "-c", `echo "$(pwd) $(ls)"`}, Workspace: tt.ws})
			if res.ExitCode != 0 || res.Stdout.Text != tt.want {
				t.Errorf("%s from sub/deep: exit %d, stdout %q, stderr %q; want %q", tt.ws, res.ExitCode, res.Stdout.Text, res.Stderr.Text, tt.want)
			}
		}
	})
	t.Run("invalid", func(t *testing.T) {
		for _, o := range []sandbox.TaskOptions{
			{Cmd: []string{"true"}, Workspace: "shared"},
			{Cmd: []string{"true"}, Home: "rw"},
		} {
			if _, err := e.m.SpawnTask(tkCtx(t), p, o); !errors.Is(err, sandbox.ErrInvalid) {
				t.Errorf("workspace %q home %q: err %v, want ErrInvalid", o.Workspace, o.Home, err)
			}
		}
	})
	if left := e.tasks(t, p); len(left) > 0 {
		t.Errorf("task sandboxes left behind: %s", left[0].Name)
	}
}

func TestTaskEnvOutputExit(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "env", nil)
	tkWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), tkConfig+"[env]\nFROM_CONFIG = \"cfg\"\n", 0o644)
	p := e.open(t, dir, "")

	var live bytes.Buffer
	res := e.spawn(t, p, sandbox.TaskOptions{
		Cmd:       []string{"bash", "-c", `echo "$FROM_CONFIG $FROM_TASK $AGENTS_SANDBOX"; head -c 5000 /dev/zero | tr '\0' o; echo err >&2; printf '\377\376' >&2; exit 7`},
		Env:       map[string]string{"FROM_TASK": "task value"},
		OutputCap: 100,
		Stdout:    &live,
		Workspace: sandbox.WorkspaceNone,
	})
	if res.ExitCode != 7 || res.TimedOut {
		t.Errorf("exit %d, timed out %v; want 7, false", res.ExitCode, res.TimedOut)
	}
	first := "cfg task value 1\n"
	if !strings.HasPrefix(res.Stdout.Text, first) || res.Stdout.Kept != 100 || res.Stdout.Bytes != int64(len(first)+5000) || !res.Stdout.Truncated {
		t.Errorf("stdout: %+v; want %q then o's, 100 of %d bytes kept, truncated", res.Stdout, first, len(first)+5000)
	}
	if live.Len() != len(first)+5000 {
		t.Errorf("the live stdout writer got %d bytes, want all %d", live.Len(), len(first)+5000)
	}
	if res.Stderr.Truncated || res.Stderr.Bytes != 6 || res.Stderr.Encoding != "base64" {
		t.Errorf("stderr: %+v; want 6 bytes, not truncated, base64 (not UTF-8)", res.Stderr)
	}
	if res.DurationMS <= 0 || res.Name == "" || res.Kept {
		t.Errorf("duration %d ms, name %q, kept %v", res.DurationMS, res.Name, res.Kept)
	}

	// Without a command the agent's headless command runs with the args.
	res = e.spawn(t, p, sandbox.TaskOptions{AgentArgs: []string{"echo", "headless", "$FROM_CONFIG"}, Workspace: sandbox.WorkspaceNone})
	if res.ExitCode != 0 || res.Stdout.Text != "headless cfg\n" {
		t.Errorf("headless: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout.Text, res.Stderr.Text)
	}
}

func TestTaskTimeout(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	p := e.open(t, e.checkout(t, "timeout", nil), "")
	e.warm(t)
	start := time.Now()
	res := e.spawn(t, p, sandbox.TaskOptions{Cmd: []string{"sleep", "1000"}, Timeout: 2 * time.Second})
	took := time.Since(start)
	if res.ExitCode != 124 || !res.TimedOut {
		t.Errorf("exit %d, timed out %v; want 124, true", res.ExitCode, res.TimedOut)
	}
	if res.DurationMS < 2000 || res.DurationMS > 10000 || took > time.Minute {
		t.Errorf("the command ran %d ms (SpawnTask took %s); want about 2 s", res.DurationMS, took)
	}
	if _, err := e.rt.InspectVM(tkCtx(t), res.Name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the timed-out task %s: inspect gives %v, want it removed", res.Name, err)
	}
	if left := e.tasks(t, p); len(left) > 0 {
		t.Errorf("task sandboxes left behind: %s", left[0].Name)
	}
}

func TestTaskKeep(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	p := e.open(t, e.checkout(t, "keep", nil), "")
	res := e.spawn(t, p, sandbox.TaskOptions{Cmd: []string{"sh", "-c", "echo kept > kept.txt"}, Keep: true})
	if res.ExitCode != 0 || !res.Kept || res.Name == "" || !slices.Equal(res.Changed, []string{"kept.txt"}) {
		t.Fatalf("exit %d, kept %v, name %q, changed %q", res.ExitCode, res.Kept, res.Name, res.Changed)
	}
	vm, err := e.rt.InspectVM(tkCtx(t), res.Name)
	if err != nil {
		t.Fatalf("the kept task: %v", err)
	}
	if vm.State == sandbox.VMRunning || vm.Labels[sandbox.LabelKind] != "task" || vm.Labels[sandbox.LabelCheckout] != p.ID.CheckoutSlug {
		t.Errorf("kept task: state %s, labels %v; want stopped, kind task, our checkout", vm.State, vm.Labels)
	}
	// Prune removes it, and only it.
	pr, err := e.m.Prune(tkCtx(t), sandbox.PruneOptions{Checkout: p.ID.CheckoutSlug})
	if err != nil {
		t.Fatal(err)
	}
	var tasks []string
	for _, r := range pr.Removed {
		if r.Kind == sandbox.KindTask {
			tasks = append(tasks, r.Name)
		}
	}
	if !slices.Equal(tasks, []string{res.Name}) {
		t.Errorf("prune removed tasks %q, want [%s]; all: %+v", tasks, res.Name, pr.Removed)
	}
	if _, err := e.rt.InspectVM(tkCtx(t), res.Name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("after prune the kept task: %v, want it gone", err)
	}
}

func TestTaskHome(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "home", nil)
	// A [home] mapping: provisioned into the VM's home and a task's fresh one.
	rc := filepath.Join(e.home, "tkrc")
	tkWrite(t, rc, "from the host\n", 0o600)
	tkWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), fmt.Sprintf("%s[home]\n\".tkrc\" = %q\n", tkConfig, rc), 0o644)
	p := e.open(t, dir, "")

	// Without a project VM there is no home to mount read-only.
	if _, err := e.m.SpawnTask(tkCtx(t), p, sandbox.TaskOptions{Cmd: []string{"true"}, Home: sandbox.HomeReadOnly, Workspace: sandbox.WorkspaceNone}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("home readonly without a VM: %v, want ErrNotFound", err)
	}

	cr := e.create(t, p)
	e.sh(t, p, "echo vm > ~/marker")

	res := e.spawn(t, p, sandbox.TaskOptions{
		Cmd:       []string{"sh", "-c", `test "$HOME" = /home/dev && test ! -e ~/marker && echo task > ~/task-file && cat ~/.tkrc && cat /proc/mounts`},
		Workspace: sandbox.WorkspaceNone,
	})
	if res.ExitCode != 0 {
		t.Errorf("fresh home: exit %d, stderr %q (the task must not see the VM's home)", res.ExitCode, res.Stderr.Text)
	}
	if !strings.HasPrefix(res.Stdout.Text, "from the host\n") {
		t.Errorf("the fresh home lacks the [home] mapping: stdout %q", res.Stdout.Text)
	}
	if strings.Contains(res.Stdout.Text, " /home/dev ") {
		t.Errorf("a fresh-home task has a mount on /home/dev:\n%s", res.Stdout.Text)
	}
	if out := e.sh(t, p, "ls -A ~"); strings.Contains(out, "task-file") {
		t.Errorf("the task wrote into the project VM's home: %q", out)
	}

	res = e.spawn(t, p, sandbox.TaskOptions{
		Cmd:       []string{"sh", "-c", `cat ~/marker; if touch ~/x 2>/dev/null; then echo writable; fi; grep " /home/dev " /proc/mounts`},
		Home:      sandbox.HomeReadOnly,
		Workspace: sandbox.WorkspaceNone,
	})
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout.Text, "vm\n") || strings.Contains(res.Stdout.Text, "writable") || !strings.Contains(res.Stdout.Text, " ro,") {
		t.Errorf("readonly home: exit %d, stdout %q, stderr %q; want the VM's marker, no write, an ro mount", res.ExitCode, res.Stdout.Text, res.Stderr.Text)
	}
	if out := e.sh(t, p, "ls -A ~"); strings.Contains(out, "x\n") {
		t.Errorf("the read-only task wrote into the VM's home: %q", out)
	}
	// The home volume is the VM's and still only the VM's.
	vols, err := e.rt.ListVolumes(tkCtx(t), map[string]string{sandbox.LabelCheckout: p.ID.CheckoutSlug})
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Name != cr.HomeVolume {
		t.Errorf("volumes of the checkout: %+v, want only %s", vols, cr.HomeVolume)
	}

	// A home volume the state records but the engine lost is an error, and
	// the engine does not make an empty one in its place.
	ctx := tkCtx(t)
	if _, err := e.m.Remove(ctx, p, false); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemoveVolume(ctx, cr.HomeVolume); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SpawnTask(ctx, p, sandbox.TaskOptions{Cmd: []string{"true"}, Home: sandbox.HomeReadOnly, Workspace: sandbox.WorkspaceNone}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("home readonly with the volume gone: %v, want ErrNotFound", err)
	}
	if _, err := e.rt.InspectVolume(ctx, cr.HomeVolume); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the lost home volume %s: %v, want it still gone", cr.HomeVolume, err)
	}
}

func TestTaskEgress(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "egress", nil)
	tkWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), "agent = \"shell\"\n[network]\nmode = \"proxy\"\n"+
		"[secrets.TK_TOKEN]\nfrom = \"env:TK_TOKEN\"\nhosts = [\"api.example.invalid\"]\n", 0o644)
	const secret = "tk-secret-value-5d1c"
	e.m.Environ = append(e.m.Environ, "TK_TOKEN="+secret)
	p := e.open(t, dir, "")

	// The task gets the project's placeholder and proxy, and the proxy is
	// its only way out.
	res := e.spawn(t, p, sandbox.TaskOptions{
		Cmd:       []string{"sh", "-c", `echo "TK_TOKEN=$TK_TOKEN"; curl -sS --noproxy '*' --max-time 10 http://proxy:3128/healthz`},
		Keep:      true,
		Workspace: sandbox.WorkspaceNone,
	})
	st, err := sandbox.LoadState(p.Names.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	as := st.Agents[p.Names.Agent]
	if as == nil || as.Placeholders["TK_TOKEN"] == "" {
		t.Fatalf("no placeholder for TK_TOKEN in state: %+v", as)
	}
	want := "TK_TOKEN=" + as.Placeholders["TK_TOKEN"] + "\nok\n"
	if res.ExitCode != 0 || res.Stdout.Text != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want %q", res.ExitCode, res.Stdout.Text, res.Stderr.Text, want)
	}
	if strings.Contains(res.Stdout.Text+res.Stderr.Text, secret) {
		t.Error("the task saw the secret's value")
	}
	vm, err := e.rt.InspectVM(tkCtx(t), res.Name)
	if err != nil {
		t.Fatal(err)
	}
	net := p.Names.VM + "-net"
	if _, ok := vm.Networks[net]; !ok || len(vm.Networks) != 1 {
		t.Errorf("task networks %v, want only the project's %s", vm.Networks, net)
	}
	for _, mt := range vm.Mounts {
		if mt.Target == sandbox.HomeDir {
			t.Errorf("a fresh-home task mounts %+v on /home/dev", mt)
		}
	}
}
