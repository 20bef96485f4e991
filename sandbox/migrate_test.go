package sandbox_test

// Tests of the migration from the origin-keyed layout (issue 8) with real
// containers, volumes and files. A legacy layout is made the way the old
// layout had it (see the comment at the top of migrate.go): a state dir
// <state>/<repo-slug>/, a VM agents-sandbox-<repo-slug>-<agent> (a busybox
// container) mounting a home volume agents-sandbox-<repo-slug>-<agent>-<ts>,
// both labelled project/agent/kind without a checkout label — plus the
// per-test label every test object carries. The helpers are prefixed mg.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/internal/testbin"
	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

// mgTestLabel marks the Docker objects these tests create directly (the
// legacy VM and volume), with a value unique to the test.
const mgTestLabel = "org.agents-sandbox.test"

// mgUserConfig is the user config layer of every test: the shell agent
// without any network (nothing to build for egress, no proxy).
const mgUserConfig = "agent = \"shell\"\n[network]\nmode = \"none\"\n"

// mgLegacyVolumeStamp is the timestamp suffix of the legacy home volume.
const mgLegacyVolumeStamp = "20240102T030405Z"

// mgEnv is one test's Manager with its own XDG directories, and a source
// repository whose clones share one origin (and so one repo slug).
type mgEnv struct {
	rt      *docker.Driver
	m       *sandbox.Manager
	root    string
	xdg     struct{ config, state, cache string }
	label   string // value of mgTestLabel
	busybox string
	origin  string // the source repository the checkouts are cloned from

	mu    sync.Mutex
	repos map[string]bool // repo slugs whose objects cleanup removes
}

// newMG connects to the engine (skipping without one or without git) and
// returns the test's environment. Everything carrying the test's label or
// the project label of one of its checkouts is removed when the test ends.
func newMG(t *testing.T) *mgEnv {
	t.Helper()
	testenv.RequireDocker(t)
	testenv.RequireGit(t)
	e := &mgEnv{root: t.TempDir(), busybox: testenv.BusyboxImage(t), repos: map[string]bool{}}
	e.label = fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	rt, err := docker.New(ctx, docker.Options{Logger: log})
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	e.rt = rt
	e.xdg.config = filepath.Join(e.root, "xdg-config")
	e.xdg.state = filepath.Join(e.root, "xdg-state")
	e.xdg.cache = filepath.Join(e.root, "xdg-cache")
	home := filepath.Join(e.root, "home")
	for _, d := range []string{e.xdg.config, e.xdg.state, e.xdg.cache, home} {
		mgMkdir(t, d)
	}
	e.m = &sandbox.Manager{
		RT: rt,
		Dirs: sandbox.Dirs{
			Config: filepath.Join(e.xdg.config, "agents-sandbox"),
			State:  filepath.Join(e.xdg.state, "agents-sandbox"),
			Cache:  filepath.Join(e.xdg.cache, "agents-sandbox"),
		},
		Log:       log,
		Environ:   []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")},
		RunAsRoot: os.Getuid() == 0,
		Now:       time.Now,
	}
	e.m.HostUID, e.m.HostGID = sandbox.DevIDs(os.Getuid(), os.Getgid())
	mgWrite(t, filepath.Join(e.m.Dirs.Config, "config.toml"), mgUserConfig)
	e.origin = gittest.Init(t, filepath.Join(e.root, fmt.Sprintf("origin-%d", time.Now().UnixNano())))
	t.Cleanup(func() {
		defer rt.Close()
		e.cleanup(t)
	})
	return e
}

// withCreate prepares the environment for Manager.Create: the debian
// fixture and a static agents-sandbox binary as the VMs' init.
func (e *mgEnv) withCreate(t *testing.T) {
	t.Helper()
	testenv.BaseImage(t)
	e.m.InitBinary = testbin.Path(t)
}

func (e *mgEnv) cleanup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.mu.Lock()
	sels := []map[string]string{{mgTestLabel: e.label}}
	for slug := range e.repos {
		sels = append(sels, map[string]string{sandbox.LabelProject: slug})
	}
	e.mu.Unlock()
	for _, sel := range sels {
		vms, err := e.rt.ListVMs(ctx, sel)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, vm := range vms {
			if err := e.rt.RemoveVM(ctx, vm.Name, true); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	for _, sel := range sels {
		vols, err := e.rt.ListVolumes(ctx, sel)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, v := range vols {
			if err := e.rt.RemoveVolume(ctx, v.Name); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("cleanup: %v", err)
			}
		}
		imgs, err := e.rt.ListImages(ctx, sel)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, img := range imgs {
			for _, tag := range img.Tags {
				_ = e.rt.RemoveImage(ctx, tag)
			}
			if err := e.rt.RemoveImage(ctx, img.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("cleanup: remove image %s: %v", img.ID, err)
			}
		}
		nets, err := e.rt.ListNetworks(ctx, sel)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, n := range nets {
			if err := e.rt.RemoveNetwork(ctx, n.Name); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
}

// clone makes <root>/<name>, a clone of the test's origin repository.
func (e *mgEnv) clone(t *testing.T, name string) string {
	t.Helper()
	return gittest.Clone(t, e.origin, filepath.Join(e.root, name))
}

// open opens the project at dir; everything labelled with its repo slug is
// removed when the test ends.
func (e *mgEnv) open(t *testing.T, dir string) *sandbox.Project {
	t.Helper()
	p, err := e.m.Open(sandbox.OpenOptions{Dir: dir})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	if p.ID.RepoSlug == p.ID.CheckoutSlug {
		t.Fatalf("%s has no origin (repo slug %s)", dir, p.ID.RepoSlug)
	}
	e.mu.Lock()
	e.repos[p.ID.RepoSlug] = true
	e.mu.Unlock()
	return p
}

func (e *mgEnv) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// mgLegacySpec says what the legacy layout of a test holds.
type mgLegacySpec struct {
	vm bool // a running legacy VM mounting the home volume (which holds /home/dev/marker)
	// state writes the legacy state.json recording the home volume
	// (modified by editState when set).
	state     bool
	editState func(*sandbox.State)
	files     map[string]string // more files of the legacy state dir
}

// mgLegacy is a legacy layout made by legacy.
type mgLegacy struct {
	layout sandbox.OriginLayout
	vm     string
	volume string
	marker string // content of /home/dev/marker on the volume
}

// legacy makes the origin-keyed layout of p's remote for agent shell.
func (e *mgEnv) legacy(t *testing.T, p *sandbox.Project, s mgLegacySpec) mgLegacy {
	t.Helper()
	ctx := e.ctx(t)
	l, ok := sandbox.OriginLayoutFor(p.ID, e.m.Dirs)
	if !ok {
		t.Fatalf("no origin layout for %+v", p.ID)
	}
	lg := mgLegacy{layout: l, vm: l.VM("shell"), volume: l.HomeVolumePrefix("shell") + mgLegacyVolumeStamp, marker: "made by the legacy VM of " + l.RepoSlug}
	labels := func(k sandbox.Kind) map[string]string {
		m := l.Labels("shell", k)
		m[mgTestLabel] = e.label
		return m
	}
	if _, err := e.rt.CreateVolume(ctx, lg.volume, labels(sandbox.KindHome)); err != nil {
		t.Fatalf("create legacy volume: %v", err)
	}
	if s.vm {
		_, err := e.rt.CreateVM(ctx, sandbox.VMSpec{
			Name:   lg.vm,
			Image:  e.busybox,
			Labels: labels(sandbox.KindVM),
			// Exits at once on SIGTERM, so the migration's stop is quick.
			Entrypoint: []string{"sh", "-c", `trap "exit 0" TERM; sleep 3600 & wait`},
			Cmd:        []string{},
			Mounts:     []sandbox.MountSpec{{Type: "volume", Source: lg.volume, Target: sandbox.HomeDir}},
			Network:    "none",
		})
		if err != nil {
			t.Fatalf("create legacy VM: %v", err)
		}
		if err := e.rt.StartVM(ctx, lg.vm); err != nil {
			t.Fatalf("start legacy VM: %v", err)
		}
		var stderr bytes.Buffer
		r, err := e.rt.Exec(ctx, lg.vm, sandbox.ExecRequest{Cmd: []string{"sh", "-c", `printf %s "$1" > /home/dev/marker`, "sh", lg.marker}, Stderr: &stderr})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("write the marker: %v, exit %d: %s", err, r.ExitCode, stderr.String())
		}
	}
	if s.state {
		st := &sandbox.State{Agents: map[string]*sandbox.AgentState{"shell": {HomeVolume: lg.volume, VM: lg.vm, Fingerprint: "legacy", ImageID: "sha256:legacy"}}}
		if s.editState != nil {
			s.editState(st)
		}
		if err := sandbox.SaveState(l.StateDir, st); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range s.files {
		mgWrite(t, filepath.Join(l.StateDir, filepath.FromSlash(name)), content)
	}
	return lg
}

func (e *mgEnv) migrate(t *testing.T, p *sandbox.Project, dry bool) sandbox.MigrationReport {
	t.Helper()
	rep, err := e.m.Migrate(e.ctx(t), p, sandbox.MigrateOptions{DryRun: dry})
	if err != nil {
		t.Fatalf("Migrate(dry %v): %v", dry, err)
	}
	for _, w := range rep.Warnings {
		t.Logf("warning: %s", w)
	}
	return rep
}

func (e *mgEnv) create(t *testing.T, p *sandbox.Project) sandbox.CreateResult {
	t.Helper()
	res, err := e.m.Create(e.ctx(t), p, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create %s: %v", p.Names.VM, err)
	}
	t.Logf("Create %s: %s, volume %s (created %v), image built %v, timings %v", res.VM, res.Action, res.HomeVolume, res.VolumeCreated, res.ImageBuilt, res.TimingsMS)
	return res
}

func (e *mgEnv) plan(t *testing.T, p *sandbox.Project) sandbox.CreatePlan {
	t.Helper()
	plan, err := e.m.PlanCreate(e.ctx(t), p, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("PlanCreate: %v", err)
	}
	return plan
}

// cat returns a file's content inside a running VM.
func (e *mgEnv) cat(t *testing.T, vm, path string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	r, err := e.rt.Exec(e.ctx(t), vm, sandbox.ExecRequest{Cmd: []string{"cat", path}, User: "0:0", Stdout: &out, Stderr: &stderr})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("cat %s in %s: %v, exit %d: %s", path, vm, err, r.ExitCode, stderr.String())
	}
	return out.String()
}

func (e *mgEnv) vmExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := e.rt.InspectVM(e.ctx(t), name)
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func (e *mgEnv) volumeExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := e.rt.InspectVolume(e.ctx(t), name)
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// homeVolume is the home volume the checkout's state records for shell.
func mgHomeVolume(t *testing.T, stateDir string) string {
	t.Helper()
	st, err := sandbox.LoadState(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if a := st.Agents["shell"]; a != nil {
		return a.HomeVolume
	}
	return ""
}

// steps lists a report's actions as "step target".
func mgSteps(rep sandbox.MigrationReport) []string {
	out := []string{}
	for _, a := range rep.Actions {
		out = append(out, string(a.Step)+" "+a.Target)
	}
	return out
}

func mgMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mgWrite(t *testing.T, path, content string) {
	t.Helper()
	mgMkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mgRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mgMissing(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still exists (%v)", path, err)
	}
}

// mgTree is a byte-for-byte picture of a directory tree: every entry's
// path, mode, modification time, and content or link target.
func mgTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		line := fmt.Sprintf("%s %v %d", rel, fi.Mode(), fi.ModTime().UnixNano())
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %q", b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			line += " -> " + target
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// engineObjects lists every VM, volume, image and network carrying one of
// the test's labels, with what identifies its current version.
func (e *mgEnv) engineObjects(t *testing.T, repo string) []string {
	t.Helper()
	ctx := e.ctx(t)
	var out []string
	for _, sel := range []map[string]string{{mgTestLabel: e.label}, {sandbox.LabelProject: repo}} {
		vms, err := e.rt.ListVMs(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, vm := range vms {
			full, err := e.rt.InspectVM(ctx, vm.Name)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("vm %s %s %s %s %v", full.Name, full.ID, full.State, full.StartedAt, full.Mounts))
		}
		vols, err := e.rt.ListVolumes(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vols {
			out = append(out, fmt.Sprintf("volume %s %s", v.Name, v.Created))
		}
		imgs, err := e.rt.ListImages(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range imgs {
			out = append(out, fmt.Sprintf("image %s %v", img.ID, img.Tags))
		}
		nets, err := e.rt.ListNetworks(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nets {
			out = append(out, fmt.Sprintf("network %s %s", n.Name, n.ID))
		}
	}
	sort.Strings(out)
	return out
}

// TestMigrateFullLayout: a full legacy layout (running VM with a home
// volume, state.json, more files and a lock file) is migrated in the order
// the design gives; a second run finds nothing; the next Create reuses the
// home volume with its contents, and PlanCreate then says the VM is reused.
func TestMigrateFullLayout(t *testing.T) {
	t.Parallel()
	e := newMG(t)
	e.withCreate(t)
	p := e.open(t, e.clone(t, "checkout"))
	lg := e.legacy(t, p, mgLegacySpec{vm: true, state: true,
		editState: func(st *sandbox.State) {
			st.Secrets = map[string]sandbox.SecretConfig{"GH": {From: "env:GH_TOKEN", Hosts: []string{"github.com"}}}
			st.TrustedProjectConfig = "trusted-hash"
		},
		files: map[string]string{"ca/ca.pem": "pem\n", "notes/deep/x.txt": "x\n", "vm-shell.lock": ""}})

	rep := e.migrate(t, p, false)
	want := []string{
		"record-volume " + lg.volume,
		"destroy-vm " + lg.vm,
		"merge-state state.json",
		"move ca/",
		"move notes/",
		"drop state.lock", // SaveState's lock, left in the legacy dir by the seeding
		"drop vm-shell.lock",
		"remove-dir " + lg.layout.StateDir,
	}
	if got := mgSteps(rep); !reflect.DeepEqual(got, want) {
		t.Errorf("actions:\n got %q\nwant %q", got, want)
	}
	if !rep.Found || !rep.Complete || rep.DryRun || len(rep.Kept) != 0 || len(rep.Warnings) == 0 {
		t.Errorf("report = %+v", rep)
	}
	if !strings.Contains(rep.Warnings[0], "migrated it") || !strings.Contains(rep.Warnings[0], lg.vm) {
		t.Errorf("warning = %q", rep.Warnings[0])
	}
	if e.vmExists(t, lg.vm) {
		t.Errorf("legacy VM %s still exists", lg.vm)
	}
	if !e.volumeExists(t, lg.volume) {
		t.Fatalf("legacy home volume %s is gone", lg.volume)
	}
	mgMissing(t, lg.layout.StateDir)
	dir := p.Names.StateDir
	if got := mgRead(t, filepath.Join(dir, "ca", "ca.pem")); got != "pem\n" {
		t.Errorf("ca/ca.pem = %q", got)
	}
	if got := mgRead(t, filepath.Join(dir, "notes", "deep", "x.txt")); got != "x\n" {
		t.Errorf("notes/deep/x.txt = %q", got)
	}
	st, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	as := st.Agents["shell"]
	if as == nil || as.HomeVolume != lg.volume || as.VM != "" || st.TrustedProjectConfig != "trusted-hash" || st.Secrets["GH"].From != "env:GH_TOKEN" {
		t.Errorf("state after migration = %+v, agent %+v", st, as)
	}
	if p.Config.Secrets["GH"].From != "env:GH_TOKEN" {
		t.Errorf("the project did not get the merged state's secret: %+v", p.Config.Secrets)
	}

	if again := e.migrate(t, p, false); again.Found || len(again.Actions) != 0 || len(again.Warnings) != 0 {
		t.Errorf("second Migrate = %+v, want nothing found", again)
	}

	res := e.create(t, p)
	if res.HomeVolume != lg.volume || res.VolumeCreated || res.Action != sandbox.VMCreatedA || res.VM != p.Names.VM {
		t.Errorf("Create = %+v, want VM %s created on home volume %s", res, p.Names.VM, lg.volume)
	}
	if got := e.cat(t, res.VM, "/home/dev/marker"); got != lg.marker {
		t.Errorf("/home/dev/marker = %q, want %q", got, lg.marker)
	}

	plan := e.plan(t, p)
	if plan.VM.Action != sandbox.VMReused || plan.VM.Name != res.VM || plan.Image.Action != sandbox.PlanReuse || plan.Image.ID != res.ImageID ||
		plan.HomeVolume != (sandbox.PlannedVolume{Name: lg.volume, Action: sandbox.PlanReuse}) || plan.Provision || plan.LegacyLayout || plan.Migration.Found {
		t.Errorf("PlanCreate after Create = %+v", plan)
	}
}

// TestMigrateStateFileDeleted: a legacy VM whose state file is gone (the
// whole legacy state dir, or only state.json in it) still hands its home
// volume over: it is recorded before the VM is destroyed, and the plan of
// the next run reuses it.
func TestMigrateStateFileDeleted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string // after record-volume and destroy-vm
	}{
		{name: "no legacy state dir"},
		{name: "state dir without state.json", files: map[string]string{"audit.jsonl": "{}\n"}, want: []string{"move audit.jsonl"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newMG(t)
			p := e.open(t, e.clone(t, "checkout"))
			lg := e.legacy(t, p, mgLegacySpec{vm: true, files: tc.files})

			rep := e.migrate(t, p, false)
			want := append([]string{"record-volume " + lg.volume, "destroy-vm " + lg.vm}, tc.want...)
			if tc.files != nil {
				want = append(want, "remove-dir "+lg.layout.StateDir)
			}
			if got := mgSteps(rep); !reflect.DeepEqual(got, want) {
				t.Errorf("actions:\n got %q\nwant %q", got, want)
			}
			if got := mgHomeVolume(t, p.Names.StateDir); got != lg.volume {
				t.Errorf("recorded home volume = %q, want %q", got, lg.volume)
			}
			if e.vmExists(t, lg.vm) || !e.volumeExists(t, lg.volume) {
				t.Errorf("after migration: VM exists %v, volume exists %v", e.vmExists(t, lg.vm), e.volumeExists(t, lg.volume))
			}
			mgMissing(t, lg.layout.StateDir)
			plan := e.plan(t, p)
			if plan.HomeVolume != (sandbox.PlannedVolume{Name: lg.volume, Action: sandbox.PlanReuse}) || plan.VM.Action != sandbox.VMCreatedA {
				t.Errorf("plan of the next run = %+v", plan)
			}
		})
	}
}

// TestMigrateTargetExists: files the checkout's state dir already has are
// kept; a different legacy copy is reported and stays (also on the next
// run), an identical one and an empty lock file are dropped, the rest
// moves, and state.json is merged field by field with the checkout's
// values winning.
func TestMigrateTargetExists(t *testing.T) {
	t.Parallel()
	e := newMG(t)
	p := e.open(t, e.clone(t, "checkout"))
	dir := p.Names.StateDir
	mine := &sandbox.State{
		Agents:  map[string]*sandbox.AgentState{"shell": {LastUsed: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}},
		Secrets: map[string]sandbox.SecretConfig{"A": {From: "env:MINE", Hosts: []string{"a.example"}}},
	}
	if err := sandbox.SaveState(dir, mine); err != nil {
		t.Fatal(err)
	}
	mgWrite(t, filepath.Join(dir, "notes.txt"), "the checkout's\n")
	mgWrite(t, filepath.Join(dir, "ca", "ca.pem"), "same\n")
	lg := e.legacy(t, p, mgLegacySpec{state: true,
		editState: func(st *sandbox.State) {
			st.Agents["codex"] = &sandbox.AgentState{HomeVolume: "legacy-codex-home", VM: "gone"}
			st.Secrets = map[string]sandbox.SecretConfig{"A": {From: "env:LEGACY"}, "B": {From: "env:B"}}
			st.TrustedProjectConfig = "legacy-trust"
		},
		files: map[string]string{"notes.txt": "the legacy one\n", "ca/ca.pem": "same\n", "ca/extra.pem": "extra\n", "vm-shell.lock": ""}})

	rep := e.migrate(t, p, false)
	want := []string{"merge-state state.json", "drop ca/ca.pem", "move ca/extra.pem", "drop state.lock", "drop vm-shell.lock"}
	if got := mgSteps(rep); !reflect.DeepEqual(got, want) {
		t.Errorf("actions:\n got %q\nwant %q", got, want)
	}
	legacyNotes := filepath.Join(lg.layout.StateDir, "notes.txt")
	if len(rep.Kept) != 1 || rep.Kept[0].Path != legacyNotes || rep.Kept[0].Target != filepath.Join(dir, "notes.txt") || rep.Complete {
		t.Errorf("kept = %+v, complete %v; want only %s", rep.Kept, rep.Complete, legacyNotes)
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), "could not move "+legacyNotes) {
		t.Errorf("warnings do not report %s: %q", legacyNotes, rep.Warnings)
	}
	if got := mgRead(t, filepath.Join(dir, "notes.txt")); got != "the checkout's\n" {
		t.Errorf("the checkout's notes.txt = %q", got)
	}
	if got := mgRead(t, legacyNotes); got != "the legacy one\n" {
		t.Errorf("the legacy notes.txt = %q", got)
	}
	if got := mgRead(t, filepath.Join(dir, "ca", "extra.pem")); got != "extra\n" {
		t.Errorf("ca/extra.pem = %q", got)
	}
	mgMissing(t, filepath.Join(lg.layout.StateDir, "ca"))
	mgMissing(t, filepath.Join(lg.layout.StateDir, "state.json"))
	st, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	wantState := map[string]string{
		"shell home":     lg.volume,
		"shell vm":       "",
		"codex home":     "legacy-codex-home",
		"codex vm":       "",
		"secret A":       "env:MINE",
		"secret B":       "env:B",
		"trust":          "legacy-trust",
		"shell lastused": "2025-01-01T00:00:00Z",
	}
	gotState := map[string]string{
		"shell home":     st.Agents["shell"].HomeVolume,
		"shell vm":       st.Agents["shell"].VM,
		"codex home":     st.Agents["codex"].HomeVolume,
		"codex vm":       st.Agents["codex"].VM,
		"secret A":       st.Secrets["A"].From,
		"secret B":       st.Secrets["B"].From,
		"trust":          st.TrustedProjectConfig,
		"shell lastused": st.Agents["shell"].LastUsed.Format(time.RFC3339),
	}
	if !reflect.DeepEqual(gotState, wantState) {
		t.Errorf("merged state:\n got %v\nwant %v", gotState, wantState)
	}

	// The next run finds the legacy dir again, reports the same file and
	// changes nothing.
	before := mgTree(t, e.m.Dirs.State)
	again := e.migrate(t, p, false)
	if !again.Found || len(again.Actions) != 0 || !reflect.DeepEqual(again.Kept, rep.Kept) {
		t.Errorf("second Migrate = %+v", again)
	}
	if after := mgTree(t, e.m.Dirs.State); !reflect.DeepEqual(before, after) {
		t.Errorf("second Migrate changed the state tree:\n%s\n---\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
	// Once the user removes the legacy copy, the next run finishes.
	if err := os.Remove(legacyNotes); err != nil {
		t.Fatal(err)
	}
	if last := e.migrate(t, p, false); !reflect.DeepEqual(mgSteps(last), []string{"remove-dir " + lg.layout.StateDir}) || !last.Complete {
		t.Errorf("Migrate after the conflict was resolved = %+v", last)
	}
	mgMissing(t, lg.layout.StateDir)
}

// TestMigrateCannotMove: a legacy file that cannot be moved is reported and
// stays, while the rest moves; the next run moves it once it can. Two real
// causes: a state.json that cannot be read (corrupt), and a file that
// cannot be renamed or linked even by root (the immutable attribute; as
// root, chmod 000 stops nothing, and rename never reads the file anyway).
func TestMigrateCannotMove(t *testing.T) {
	t.Parallel()
	e := newMG(t)
	p := e.open(t, e.clone(t, "checkout"))
	lg := e.legacy(t, p, mgLegacySpec{files: map[string]string{"state.json": "{not json", "stuck.txt": "stuck\n", "ok.txt": "ok\n"}})
	stuck := filepath.Join(lg.layout.StateDir, "stuck.txt")
	immutable := true
	if err := mgImmutable(stuck, true); err != nil {
		immutable = false
		t.Logf("cannot make %s immutable (%v): only the corrupt state.json is checked", stuck, err)
		if err := os.Remove(stuck); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Cleanup(func() { _ = mgImmutable(stuck, false) })
	}

	rep := e.migrate(t, p, false)
	if got, want := mgSteps(rep), []string{"move ok.txt"}; !reflect.DeepEqual(got, want) {
		t.Errorf("actions = %q, want %q", got, want)
	}
	kept := map[string]string{}
	for _, k := range rep.Kept {
		kept[filepath.Base(k.Path)] = k.Reason
	}
	if !strings.Contains(kept["state.json"], "cannot read it") {
		t.Errorf("state.json: kept %q", kept["state.json"])
	}
	if immutable && !strings.Contains(kept["stuck.txt"], "operation not permitted") {
		t.Errorf("stuck.txt: kept %q", kept["stuck.txt"])
	}
	if rep.Complete {
		t.Error("report says complete")
	}
	if got := mgRead(t, filepath.Join(lg.layout.StateDir, "state.json")); got != "{not json" {
		t.Errorf("the legacy state.json changed: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(p.Names.StateDir, "stuck.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stuck.txt has a second name in the checkout's state dir (%v)", err)
	}
	if got := mgRead(t, filepath.Join(p.Names.StateDir, "ok.txt")); got != "ok\n" {
		t.Errorf("ok.txt = %q", got)
	}

	// Fixed by hand: the next run finishes.
	if immutable {
		if err := mgImmutable(stuck, false); err != nil {
			t.Fatal(err)
		}
	}
	mgWrite(t, filepath.Join(lg.layout.StateDir, "state.json"), `{"version":1,"trusted_project_config":"t"}`)
	rep = e.migrate(t, p, false)
	if !rep.Complete || len(rep.Kept) != 0 {
		t.Errorf("after the fix: %+v", rep)
	}
	mgMissing(t, lg.layout.StateDir)
	if immutable {
		if got := mgRead(t, filepath.Join(p.Names.StateDir, "stuck.txt")); got != "stuck\n" {
			t.Errorf("stuck.txt = %q", got)
		}
	}
}

// mgHelperPath builds testdata/migratehelper into a directory of the test.
func mgHelperPath(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "migratehelper")
	if out, err := exec.Command("go", "build", "-o", path, "./testdata/migratehelper").CombinedOutput(); err != nil {
		t.Fatalf("build migratehelper: %v\n%s", err, out)
	}
	return path
}

// TestMigrateKilledBetweenSteps: a migration process killed (SIGKILL) right
// after a step leaves a state from which the next run finishes the
// migration; at no point is the home volume unaccounted for.
func TestMigrateKilledBetweenSteps(t *testing.T) {
	t.Parallel()
	helper := mgHelperPath(t)
	files := map[string]string{"a.txt": "a\n", "b/c.txt": "c\n", "z.txt": "z\n"}
	for _, tc := range []struct {
		step sandbox.MigrationStep
		n    int
	}{
		{sandbox.StepRecordVolume, 1},
		{sandbox.StepDestroyVM, 1},
		{sandbox.StepMergeState, 1},
		{sandbox.StepMove, 1},
		{sandbox.StepMove, 3}, // the last move: before the legacy dir is removed
	} {
		t.Run(fmt.Sprintf("%s-%d", tc.step, tc.n), func(t *testing.T) {
			t.Parallel()
			e := newMG(t)
			dir := e.clone(t, "checkout")
			p := e.open(t, dir)
			lg := e.legacy(t, p, mgLegacySpec{vm: true, state: true, files: files})

			cmd := exec.Command(helper)
			cmd.Env = append(os.Environ(),
				"MIGRATE_HELPER_DIR="+dir, "MIGRATE_HELPER_STATE="+e.m.Dirs.State, "MIGRATE_HELPER_CONFIG="+e.m.Dirs.Config,
				"MIGRATE_HELPER_AGENT=shell", "MIGRATE_HELPER_STOP_AT="+string(tc.step), fmt.Sprintf("MIGRATE_HELPER_STOP_N=%d", tc.n))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
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
			t.Cleanup(func() {
				stdin.Close()
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			})
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if !strings.HasPrefix(line, "stopped after "+string(tc.step)) {
				t.Fatalf("helper said %q (%v); stderr:\n%s", line, err, stderr.String())
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err == nil {
				t.Fatal("the helper was not killed")
			}

			// Where the home volume is known from right now.
			if !e.volumeExists(t, lg.volume) {
				t.Fatalf("home volume %s is gone after a kill after %s", lg.volume, line)
			}
			legacyRecord := ""
			if st, err := sandbox.LoadState(lg.layout.StateDir); err == nil && st.Agents["shell"] != nil {
				legacyRecord = st.Agents["shell"].HomeVolume
			}
			if mgHomeVolume(t, p.Names.StateDir) != lg.volume && legacyRecord != lg.volume && !e.vmExists(t, lg.vm) {
				t.Fatalf("after a kill after %s nothing records home volume %s", line, lg.volume)
			}

			rep := e.migrate(t, p, false)
			if !rep.Found || !rep.Complete || len(rep.Kept) != 0 {
				t.Errorf("the run after the kill: %+v", rep)
			}
			if got := mgHomeVolume(t, p.Names.StateDir); got != lg.volume {
				t.Errorf("recorded home volume = %q, want %q", got, lg.volume)
			}
			if e.vmExists(t, lg.vm) {
				t.Errorf("legacy VM %s still exists", lg.vm)
			}
			mgMissing(t, lg.layout.StateDir)
			for name, content := range files {
				if got := mgRead(t, filepath.Join(p.Names.StateDir, filepath.FromSlash(name))); got != content {
					t.Errorf("%s = %q, want %q", name, got, content)
				}
			}
			if again := e.migrate(t, p, false); again.Found {
				t.Errorf("a third run found something: %+v", again)
			}
		})
	}
}

// TestMigrateDryRun: a dry run (Migrate and PlanCreate) reports what the
// migration and the run would do, resolving against the legacy layout, and
// leaves the state tree byte for byte and the engine's objects as they
// were; the real migration then does what the dry run said.
func TestMigrateDryRun(t *testing.T) {
	t.Parallel()
	e := newMG(t)
	p := e.open(t, e.clone(t, "checkout"))
	lg := e.legacy(t, p, mgLegacySpec{vm: true, state: true, files: map[string]string{"ca/ca.pem": "pem\n", "vm-shell.lock": ""}})
	mgWrite(t, filepath.Join(p.Names.StateDir, "ca", "ca.pem"), "another\n")

	arts, err := e.m.LegacyArtifacts(e.ctx(t), p.ID.RepoSlug)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range arts {
		names = append(names, string(a.Kind)+" "+a.Name)
	}
	if want := []string{"home " + lg.volume, "vm " + lg.vm}; !reflect.DeepEqual(names, want) {
		t.Errorf("LegacyArtifacts = %q, want %q", names, want)
	}

	tree := mgTree(t, e.m.Dirs.State)
	objects := e.engineObjects(t, p.ID.RepoSlug)

	dry := e.migrate(t, p, true)
	plan := e.plan(t, p)

	if got := mgTree(t, e.m.Dirs.State); !reflect.DeepEqual(got, tree) {
		t.Errorf("the dry run changed the state tree:\nbefore\n%s\nafter\n%s", strings.Join(tree, "\n"), strings.Join(got, "\n"))
	}
	if got := e.engineObjects(t, p.ID.RepoSlug); !reflect.DeepEqual(got, objects) {
		t.Errorf("the dry run changed the engine's objects:\nbefore\n%s\nafter\n%s", strings.Join(objects, "\n"), strings.Join(got, "\n"))
	}

	wantSteps := []string{"record-volume " + lg.volume, "destroy-vm " + lg.vm, "merge-state state.json", "drop state.lock", "drop vm-shell.lock"}
	if got := mgSteps(dry); !dry.DryRun || !dry.Found || dry.Complete || !reflect.DeepEqual(got, wantSteps) {
		t.Errorf("dry-run report: dry %v found %v complete %v actions %q, want %q", dry.DryRun, dry.Found, dry.Complete, got, wantSteps)
	}
	if len(dry.Kept) != 1 || dry.Kept[0].Path != filepath.Join(lg.layout.StateDir, "ca", "ca.pem") {
		t.Errorf("dry-run kept = %+v, want ca/ca.pem", dry.Kept)
	}
	if len(dry.Warnings) == 0 || !strings.Contains(dry.Warnings[0], "the first run that is not a dry run migrates it") {
		t.Errorf("dry-run warnings = %q", dry.Warnings)
	}
	if !plan.LegacyLayout || !reflect.DeepEqual(mgSteps(plan.Migration), wantSteps) ||
		plan.HomeVolume != (sandbox.PlannedVolume{Name: lg.volume, Action: sandbox.PlanReuse}) ||
		plan.VM.Action != sandbox.VMCreatedA || plan.VM.Name != p.Names.VM || plan.VM.Current != "" ||
		plan.Image.Action != sandbox.PlanBuild || plan.Image.Ref != p.Names.RunnerImage || !plan.Provision || plan.Network != "none" {
		t.Errorf("plan = %+v", plan)
	}
	changes := strings.Join(plan.Changes, "\n")
	for _, want := range []string{"destroy legacy VM " + lg.vm, "build image " + p.Names.RunnerImage, "create VM " + p.Names.VM + " with home volume " + lg.volume} {
		if !strings.Contains(changes, want) {
			t.Errorf("plan changes lack %q:\n%s", want, changes)
		}
	}

	real := e.migrate(t, p, false)
	if got := mgSteps(real); !reflect.DeepEqual(got, wantSteps) || !reflect.DeepEqual(real.Kept, dry.Kept) {
		t.Errorf("the real migration did %q (kept %+v), the dry run said %q (kept %+v)", got, real.Kept, wantSteps, dry.Kept)
	}

	// Proxy mode: the plan says the VM's network would be created and the
	// proxy started, and neither happens.
	pp, err := e.m.Open(sandbox.OpenOptions{Dir: p.ID.ProjectDir, Flags: map[string]string{"network.mode": "proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	tree, objects = mgTree(t, e.m.Dirs.State), e.engineObjects(t, p.ID.RepoSlug)
	plan = e.plan(t, pp)
	if !plan.Proxy.Used || !plan.Proxy.Start || plan.Network == "" || plan.Network == "none" || len(plan.Migration.Actions) != 0 {
		t.Errorf("proxy-mode plan = %+v", plan)
	}
	if !strings.Contains(plan.Warnings[0], "what is left of it cannot move") {
		t.Errorf("warning with only a conflict left = %q", plan.Warnings[0])
	}
	if changes := strings.Join(plan.Changes, "\n"); !strings.Contains(changes, "create network "+plan.Network) || !strings.Contains(changes, "start the secret proxy") {
		t.Errorf("proxy-mode plan changes:\n%s", changes)
	}
	if got := mgTree(t, e.m.Dirs.State); !reflect.DeepEqual(got, tree) {
		t.Errorf("the proxy-mode plan changed the state tree")
	}
	if got := e.engineObjects(t, p.ID.RepoSlug); !reflect.DeepEqual(got, objects) {
		t.Errorf("the proxy-mode plan changed the engine's objects:\n%s\n---\n%s", strings.Join(objects, "\n"), strings.Join(got, "\n"))
	}
	arts, err = e.m.LegacyArtifacts(e.ctx(t), p.ID.RepoSlug)
	if err != nil || len(arts) != 1 || arts[0].Name != lg.volume {
		t.Errorf("LegacyArtifacts after the migration = %+v, %v; want only the home volume", arts, err)
	}
}

// mgCounting is the real runtime with its reads counted (a spy, not a
// fake: every call reaches the engine).
type mgCounting struct {
	sandbox.Runtime
	mu    sync.Mutex
	calls []string
}

func (c *mgCounting) count(s string) {
	c.mu.Lock()
	c.calls = append(c.calls, s)
	c.mu.Unlock()
}

func (c *mgCounting) InspectVM(ctx context.Context, name string) (sandbox.VM, error) {
	c.count("InspectVM " + name)
	return c.Runtime.InspectVM(ctx, name)
}

func (c *mgCounting) ListVMs(ctx context.Context, l map[string]string) ([]sandbox.VM, error) {
	c.count("ListVMs")
	return c.Runtime.ListVMs(ctx, l)
}

func (c *mgCounting) InspectVolume(ctx context.Context, name string) (sandbox.Volume, error) {
	c.count("InspectVolume " + name)
	return c.Runtime.InspectVolume(ctx, name)
}

func (c *mgCounting) ListVolumes(ctx context.Context, l map[string]string) ([]sandbox.Volume, error) {
	c.count("ListVolumes")
	return c.Runtime.ListVolumes(ctx, l)
}

// TestMigrateTwoClones: two clones of one remote shared the legacy layout.
// Racing, exactly one migrates it; the other finds nothing (and later runs
// of it cost one inspect); each then gets its own VM, the migrating one on
// the legacy home volume and the other on a new one. A checkout without an
// origin never looks at the engine.
func TestMigrateTwoClones(t *testing.T) {
	t.Parallel()
	e := newMG(t)
	e.withCreate(t)
	pa, pb := e.open(t, e.clone(t, "a")), e.open(t, e.clone(t, "b"))
	if pa.ID.RepoSlug != pb.ID.RepoSlug || pa.ID.CheckoutSlug == pb.ID.CheckoutSlug {
		t.Fatalf("slugs: a %s/%s, b %s/%s", pa.ID.RepoSlug, pa.ID.CheckoutSlug, pb.ID.RepoSlug, pb.ID.CheckoutSlug)
	}
	lg := e.legacy(t, pa, mgLegacySpec{vm: true, state: true, files: map[string]string{"notes.txt": "n\n"}})

	ctx := e.ctx(t)
	reps := make([]sandbox.MigrationReport, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range []*sandbox.Project{pa, pb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			reps[i], errs[i] = e.m.Migrate(ctx, p, sandbox.MigrateOptions{})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Migrate %d: %v", i, err)
		}
	}
	if reps[0].Found == reps[1].Found {
		t.Fatalf("found: a %v, b %v; want exactly one", reps[0].Found, reps[1].Found)
	}
	first, second := pa, pb
	if reps[1].Found {
		first, second = pb, pa
	}
	t.Logf("%s migrated the shared layout", first.ID.CheckoutSlug)
	if !reps[0].Complete || !reps[1].Complete {
		t.Errorf("reports: %+v / %+v", reps[0], reps[1])
	}
	if got := mgHomeVolume(t, first.Names.StateDir); got != lg.volume {
		t.Errorf("the first clone records %q, want %q", got, lg.volume)
	}
	if got := mgHomeVolume(t, second.Names.StateDir); got != "" {
		t.Errorf("the second clone records %q, want none", got)
	}
	if got := mgRead(t, filepath.Join(first.Names.StateDir, "notes.txt")); got != "n\n" {
		t.Errorf("notes.txt = %q", got)
	}

	// The second clone's later runs: one stat, one inspect.
	spy := &mgCounting{Runtime: e.rt}
	m := *e.m
	m.RT = spy
	rep, err := m.Migrate(e.ctx(t), second, sandbox.MigrateOptions{})
	if err != nil || rep.Found {
		t.Fatalf("Migrate of the second clone again: %+v, %v", rep, err)
	}
	if want := []string{"InspectVM " + lg.vm}; !reflect.DeepEqual(spy.calls, want) {
		t.Errorf("engine calls with nothing to migrate = %q, want %q", spy.calls, want)
	}
	spy.calls = nil
	plain := gittest.Init(t, filepath.Join(e.root, "no-origin"))
	id, err := sandbox.Resolve(plain)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := m.MigrateCheckout(e.ctx(t), id, "shell", sandbox.MigrateOptions{}); err != nil || rep.Found || rep.RepoSlug != "" || len(spy.calls) != 0 {
		t.Errorf("Migrate of a checkout without origin: %+v, %v, engine calls %q", rep, err, spy.calls)
	}

	objects := e.engineObjects(t, second.ID.RepoSlug)
	plan := e.plan(t, second)
	if plan.HomeVolume.Action != sandbox.PlanNew || !strings.HasPrefix(plan.HomeVolume.Name, second.Names.HomeVolumePrefix) ||
		!strings.Contains(strings.Join(plan.Changes, "\n"), "create volume "+plan.HomeVolume.Name) {
		t.Errorf("the second clone's plan = %+v", plan)
	}
	if got := e.engineObjects(t, second.ID.RepoSlug); !reflect.DeepEqual(got, objects) {
		t.Errorf("PlanCreate changed the engine's objects:\n%s\n---\n%s", strings.Join(objects, "\n"), strings.Join(got, "\n"))
	}

	ra, rb := e.create(t, first), e.create(t, second)
	if ra.HomeVolume != lg.volume || ra.VolumeCreated {
		t.Errorf("the first clone's Create = %+v, want home volume %s", ra, lg.volume)
	}
	if !rb.VolumeCreated || rb.HomeVolume == lg.volume || !strings.HasPrefix(rb.HomeVolume, second.Names.HomeVolumePrefix) {
		t.Errorf("the second clone's Create = %+v, want a new home volume", rb)
	}
	if ra.VM == rb.VM || ra.VM != first.Names.VM || rb.VM != second.Names.VM {
		t.Errorf("VMs: %s and %s", ra.VM, rb.VM)
	}
	if got := e.cat(t, ra.VM, "/home/dev/marker"); got != lg.marker {
		t.Errorf("the first clone's marker = %q", got)
	}
}

// TestMigrateCLI: `agents-sandbox migrate` as a subprocess: --dry-run --json
// prints the report on stdout and the warning on stderr and changes
// nothing; a real run prints what it did; the next finds nothing.
func TestMigrateCLI(t *testing.T) {
	t.Parallel()
	e := newMG(t)
	bin := testbin.Path(t)
	dir := e.clone(t, "checkout")
	p := e.open(t, dir)
	lg := e.legacy(t, p, mgLegacySpec{vm: true, state: true})
	run := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.CommandContext(e.ctx(t), bin, append([]string{"migrate", "-C", dir}, args...)...)
		cmd.Env = []string{
			"HOME=" + filepath.Join(e.root, "home"), "PATH=" + os.Getenv("PATH"),
			"XDG_CONFIG_HOME=" + e.xdg.config, "XDG_STATE_HOME=" + e.xdg.state, "XDG_CACHE_HOME=" + e.xdg.cache,
		}
		if h := os.Getenv("DOCKER_HOST"); h != "" {
			cmd.Env = append(cmd.Env, "DOCKER_HOST="+h)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("agents-sandbox migrate %q: %v\n%s", args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}

	tree := mgTree(t, e.m.Dirs.State)
	out, errOut := run("--dry-run", "--json")
	var rep sandbox.MigrationReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if !rep.DryRun || !rep.Found || len(rep.Actions) == 0 || !strings.Contains(errOut, "warning: found the origin-keyed layout") {
		t.Errorf("dry run: %+v\nstderr: %s", rep, errOut)
	}
	if got := mgTree(t, e.m.Dirs.State); !reflect.DeepEqual(got, tree) || !e.vmExists(t, lg.vm) {
		t.Errorf("the dry run changed something")
	}

	out, errOut = run()
	if !strings.Contains(out, "migrated the origin-keyed layout of "+p.ID.RepoSlug) || !strings.Contains(out, "destroy-vm") || !strings.Contains(errOut, "migrated it") {
		t.Errorf("migrate printed:\n%s\nstderr:\n%s", out, errOut)
	}
	if out, _ = run(); !strings.HasPrefix(out, "nothing to migrate") {
		t.Errorf("the second migrate printed %q", out)
	}
}
