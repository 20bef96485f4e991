package sandbox_test

// End-to-end tests of Manager.Prune and `agents-sandbox prune` against the
// real engine. Every prune here is limited to the test's own checkout
// (PruneOptions.Checkout, `prune --dir`): other tests share the engine, and
// their task sandboxes and images are not this test's to remove.

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// tkTestLabel marks the objects a test creates that must look unrelated to
// agents-sandbox: Prune selects by kind and checkout, never by this label.
const tkTestLabel = "org.agents-sandbox.test"

// build builds a one-file-context image from dockerfile and fails the test
// on error.
func (e *tkEnv) build(t *testing.T, dockerfile, tag string, labels map[string]string) sandbox.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(dockerfile))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(dockerfile)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	img, err := e.rt.BuildImage(tkCtx(t), sandbox.BuildRequest{Context: &buf, DockerfilePath: "Dockerfile", Tags: []string{tag}, Labels: labels}, nil)
	if err != nil {
		t.Fatalf("build %s: %v", tag, err)
	}
	return img
}

// objects lists, sorted, every container, volume and image carrying any
// of the label sets, with what Prune could change about them.
func (e *tkEnv) objects(t *testing.T, sets ...map[string]string) []string {
	t.Helper()
	ctx := tkCtx(t)
	seen := map[string]bool{}
	for _, labels := range sets {
		vms, err := e.rt.ListVMs(ctx, labels)
		if err != nil {
			t.Fatal(err)
		}
		for _, vm := range vms {
			seen[fmt.Sprintf("container %s %s %s", vm.Name, vm.State, vm.ImageID)] = true
		}
		vols, err := e.rt.ListVolumes(ctx, labels)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vols {
			seen["volume "+v.Name] = true
		}
		nets, err := e.rt.ListNetworks(ctx, labels)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nets {
			seen["network "+n.Name] = true
		}
		imgs, err := e.rt.ListImages(ctx, labels)
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range imgs {
			var tags []string
			for _, tag := range img.Tags {
				if !strings.HasPrefix(tag, "<none>") { // an untagged image as the engine lists it
					tags = append(tags, tag)
				}
			}
			sort.Strings(tags)
			seen[fmt.Sprintf("image %s %v", img.ID, tags)] = true
		}
	}
	out := make([]string, 0, len(seen))
	for o := range seen {
		out = append(out, o)
	}
	sort.Strings(out)
	return out
}

// pruned indexes a prune result by "kind name".
func tkPruned(res sandbox.PruneResult) map[string]sandbox.Pruned {
	out := map[string]sandbox.Pruned{}
	for _, r := range res.Removed {
		out[string(r.Kind)+" "+r.Name] = r
	}
	return out
}

func tkKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// tkSyncBuffer is a bytes.Buffer a child process writes to while the test
// reads it.
type tkSyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *tkSyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *tkSyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestPruneLabelledLeftovers(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "prune", nil)
	p := e.open(t, dir, "")
	slug := p.ID.CheckoutSlug
	ours := map[string]string{sandbox.LabelCheckout: slug}
	mine := map[string]string{tkTestLabel: slug}
	t.Cleanup(func() { tkSweep(t, e.rt, mine) })
	ctx := tkCtx(t)

	// Our leftovers: a stopped project VM with its home volume and runner
	// image, a kept (stopped) task, a second runner tag no VM uses, and a
	// dangling layer of our builds.
	cr := e.create(t, p)
	if _, err := e.m.Stop(ctx, p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	kept := e.spawn(t, p, sandbox.TaskOptions{Cmd: []string{"true"}, Keep: true, Workspace: sandbox.WorkspaceNone})
	runnerLabels := p.ID.Labels(p.Names.Agent, sandbox.KindRunner)
	busybox := testenv.BusyboxImage(t)
	spare := "agents-sandbox/runner-" + slug + ":spare"
	dangling := e.build(t, "FROM "+busybox+"\nRUN echo 1 > /layer\n", spare, runnerLabels)
	e.build(t, "FROM "+busybox+"\nRUN echo 2 > /layer\n", spare, runnerLabels)

	// Unrelated objects: none carries our kind or checkout labels.
	unrelated := "tk-unrelated-" + slug
	if _, err := e.rt.CreateVM(ctx, sandbox.VMSpec{Name: unrelated, Image: busybox, Labels: mine, Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.CreateVolume(ctx, unrelated, mine); err != nil {
		t.Fatal(err)
	}
	otherTag := "agents-sandbox-test/" + unrelated + ":v1"
	other := e.build(t, "FROM "+busybox+"\nRUN echo other > /other\n", otherTag, mine)
	otherDangling := e.build(t, "FROM "+busybox+"\nRUN echo a > /moving\n", "agents-sandbox-test/"+unrelated+":moving", mine)
	e.build(t, "FROM "+busybox+"\nRUN echo b > /moving\n", "agents-sandbox-test/"+unrelated+":moving", mine)

	all := e.objects(t, ours, mine)
	t.Logf("objects before:\n%s", strings.Join(all, "\n"))
	for _, want := range []string{"volume " + cr.HomeVolume, "volume " + unrelated, "image " + dangling.ID + " []", "image " + otherDangling.ID + " []"} {
		if !slices.Contains(all, want) {
			t.Fatalf("the engine does not list %q", want)
		}
	}
	unchanged := func(what string) {
		t.Helper()
		if after := e.objects(t, ours, mine); !slices.Equal(after, all) {
			t.Fatalf("%s changed the engine's objects:\nbefore:\n%s\nafter:\n%s", what, strings.Join(all, "\n"), strings.Join(after, "\n"))
		}
	}

	// Dry runs list without changing anything; an hour later with an age
	// of 30 minutes the VM, its home volume and the images are due too.
	later := time.Now().Add(time.Hour)
	e.m.Now = func() time.Time { return later }
	dry, err := e.m.Prune(ctx, sandbox.PruneOptions{Checkout: slug, Age: 30 * time.Minute, Volumes: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	unchanged("Prune with DryRun")
	wantDry := []string{"home " + cr.HomeVolume, "runner " + p.Names.RunnerImage, "runner " + spare, "task " + kept.Name, "vm " + p.Names.VM}
	if got := tkKeys(tkPruned(dry)); !dry.DryRun || !slices.Equal(got, wantDry) {
		t.Errorf("dry run (dry %v) lists %q, want %q", dry.DryRun, got, wantDry)
	}
	e.m.Now = time.Now

	out, stderr, code := e.cli(t, dir, "prune", "--dry-run", "--dir", dir)
	if code != 0 || !strings.Contains(out, "would remove task "+kept.Name+" (kept task sandbox, stopped;") || !strings.Contains(out, "1 item(s), 0 B would be freed") {
		t.Errorf("prune --dry-run: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	unchanged("prune --dry-run")

	// Now: only the kept task and the dangling layer are due; the VM is
	// recent and keeps its image, the spare tag is too new to take.
	res, err := e.m.Prune(ctx, sandbox.PruneOptions{Checkout: slug})
	if err != nil {
		t.Fatal(err)
	}
	got := tkPruned(res)
	if want := []string{"runner dangling build layers", "task " + kept.Name}; !slices.Equal(tkKeys(got), want) {
		t.Errorf("prune removed %q, want %q", tkKeys(got), want)
	}
	if d := got["runner dangling build layers"]; d.Bytes <= 0 || res.BytesFreed != d.Bytes {
		t.Errorf("dangling layers freed %d bytes, total %d; want > 0 and equal", d.Bytes, res.BytesFreed)
	}
	if _, err := e.rt.InspectImage(ctx, dangling.ID); err == nil {
		t.Errorf("our dangling image %s survived", dangling.ID)
	}

	// An hour later: the stopped VM and the images no VM uses go; the home
	// volume stays without Volumes.
	e.m.Now = func() time.Time { return later }
	res, err = e.m.Prune(ctx, sandbox.PruneOptions{Checkout: slug, Age: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got = tkPruned(res)
	if want := []string{"runner " + p.Names.RunnerImage, "runner " + spare, "vm " + p.Names.VM}; !slices.Equal(tkKeys(got), want) {
		t.Errorf("prune an hour later removed %q, want %q", tkKeys(got), want)
	}
	if vm := got["vm "+p.Names.VM]; !strings.HasPrefix(vm.Reason, "unused since ") {
		t.Errorf("VM reason %q", vm.Reason)
	}
	if img := got["runner "+p.Names.RunnerImage]; img.Bytes <= 0 || res.BytesFreed < img.Bytes {
		t.Errorf("runner image: %d bytes, total freed %d; want its size counted", img.Bytes, res.BytesFreed)
	}
	left := e.objects(t, ours)
	if want := []string{"volume " + cr.HomeVolume}; !slices.Equal(left, want) {
		t.Errorf("left of ours: %q, want only the home volume %q", left, want)
	}

	// With Volumes, the home volume goes (unused since the VM last ran)
	// and the checkout's state forgets it.
	res, err = e.m.Prune(ctx, sandbox.PruneOptions{Checkout: slug, Age: 30 * time.Minute, Volumes: true})
	if err != nil {
		t.Fatal(err)
	}
	got = tkPruned(res)
	if vol, ok := got["home "+cr.HomeVolume]; !ok || len(got) != 1 || !strings.HasPrefix(vol.Reason, "home volume unused since ") {
		t.Errorf("prune --volumes removed %+v, want the home volume %s", res.Removed, cr.HomeVolume)
	}
	if left := e.objects(t, ours); len(left) > 0 {
		t.Errorf("left of ours: %q", left)
	}
	st, err := sandbox.LoadState(p.Names.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if as := st.Agents[p.Names.Agent]; as == nil || as.HomeVolume != "" {
		t.Errorf("state after pruning the home volume: %+v, want it forgotten", as)
	}

	// The unrelated objects are all still there.
	if _, err := e.rt.InspectVM(ctx, unrelated); err != nil {
		t.Errorf("unrelated container: %v", err)
	}
	if _, err := e.rt.InspectVolume(ctx, unrelated); err != nil {
		t.Errorf("unrelated volume: %v", err)
	}
	for _, id := range []string{other.ID, otherDangling.ID} {
		if _, err := e.rt.InspectImage(ctx, id); err != nil {
			t.Errorf("unrelated image %s: %v", id, err)
		}
	}
	if _, err := e.rt.InspectImage(ctx, otherTag); err != nil {
		t.Errorf("unrelated image tag %s: %v", otherTag, err)
	}
}

func TestPruneVMWithVolume(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "prunevm", nil)
	// In proxy mode the VM has a proxy container and a network of its own,
	// which go with it.
	tkWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), "agent = \"shell\"\n[network]\nmode = \"proxy\"\n", 0o644)
	p := e.open(t, dir, "")
	ctx := tkCtx(t)
	cr := e.create(t, p)
	later := time.Now().Add(2 * time.Hour)
	e.m.Now = func() time.Time { return later }
	opts := sandbox.PruneOptions{Checkout: p.ID.CheckoutSlug, Age: time.Hour, Volumes: true}

	// A running VM is in use whatever its age.
	res, err := e.m.Prune(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 0 {
		t.Errorf("prune with the VM running removed %+v", res.Removed)
	}

	if _, err := e.m.Stop(ctx, p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Stopped but used within the age: kept.
	e.m.Now = time.Now
	if res, err = e.m.Prune(ctx, opts); err != nil || len(res.Removed) != 0 {
		t.Errorf("prune of a recently used VM: %+v, %v; want nothing removed", res.Removed, err)
	}
	e.m.Now = func() time.Time { return later }
	res, err = e.m.Prune(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"home " + cr.HomeVolume, "network " + p.Names.VM + "-net", "proxy " + p.Names.VM + "-proxy", "runner " + p.Names.RunnerImage, "vm " + p.Names.VM}
	if got := tkPruned(res); !slices.Equal(tkKeys(got), want) || got["home "+cr.HomeVolume].Reason != "home volume of a pruned VM" {
		t.Errorf("prune removed %+v, want %q", res.Removed, want)
	}
	if left := e.objects(t, map[string]string{sandbox.LabelCheckout: p.ID.CheckoutSlug}); len(left) > 0 {
		t.Errorf("left of ours: %q", left)
	}
	// The next Create starts afresh with a new home volume.
	e.m.Now = time.Now
	again := e.create(t, p)
	if !again.VolumeCreated {
		t.Errorf("Create after prune: volume %s not created afresh", again.HomeVolume)
	}
}

func TestPruneTaskWhoseSpawnerDied(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "orphan", nil)
	p := e.open(t, dir, "")
	e.warm(t)

	cmd := e.cliCmd(t, dir, "task", "--workspace", "none", "--", "sleep", "1000")
	var stderr tkSyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var task sandbox.VM
	tkWaitFor(t, 2*time.Minute, "the CLI's task running", func() (bool, string) {
		for _, vm := range e.tasks(t, p) {
			if vm.State == sandbox.VMRunning {
				task = vm
				return true, ""
			}
		}
		select {
		case <-exited:
			t.Fatalf("the CLI exited early: %v\n%s", waitErr, stderr.String())
		default:
		}
		return false, "no running task yet; stderr: " + stderr.String()
	})
	if pid := task.Labels["org.agents-sandbox.spawner-pid"]; pid != fmt.Sprint(cmd.Process.Pid) {
		t.Errorf("spawner-pid label %q, want the CLI's pid %d", pid, cmd.Process.Pid)
	}

	ctx := tkCtx(t)
	opts := sandbox.PruneOptions{Checkout: p.ID.CheckoutSlug}
	res, err := e.m.Prune(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tkPruned(res)["task "+task.Name]; ok {
		t.Fatalf("prune removed the running task of a live spawner: %+v", res.Removed)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	if waitErr == nil {
		t.Fatal("the killed CLI exited 0")
	}
	if vm, err := e.rt.InspectVM(ctx, task.Name); err != nil || vm.State != sandbox.VMRunning {
		t.Fatalf("after the spawner died the task is %s, %v; want it still running", vm.State, err)
	}
	res, err = e.m.Prune(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := tkPruned(res)["task "+task.Name]
	if !ok || !strings.Contains(r.Reason, "spawner (pid "+fmt.Sprint(cmd.Process.Pid)+") is gone") {
		t.Errorf("prune after the spawner died: %+v, want the task removed for its dead spawner", res.Removed)
	}
	if left := e.tasks(t, p); len(left) > 0 {
		t.Errorf("task sandboxes left: %s", left[0].Name)
	}
}

// A VM that stopped itself when idle leaves its proxy running; Prune
// removes that proxy (and only it), and the next Create starts a new one.
func TestPruneProxyOfIdleStoppedVM(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "pruneproxy", nil)
	tkWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), "agent = \"shell\"\n[network]\nmode = \"proxy\"\n", 0o644)
	p := e.open(t, dir, "")
	ctx := tkCtx(t)
	e.create(t, p)
	proxyName := p.Names.VM + "-proxy"
	opts := sandbox.PruneOptions{Checkout: p.ID.CheckoutSlug}

	// Running VM and proxy: nothing to prune.
	if res, err := e.m.Prune(ctx, opts); err != nil || len(res.Removed) != 0 {
		t.Fatalf("prune with everything running: %+v, %v", res.Removed, err)
	}
	// The VM alone stops, as its idle watchdog does.
	if err := e.rt.StopVM(ctx, p.Names.VM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dry, err := e.m.Prune(ctx, sandbox.PruneOptions{Checkout: p.ID.CheckoutSlug, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if px, err := e.rt.InspectVM(ctx, proxyName); err != nil || px.State != sandbox.VMRunning {
		t.Fatalf("a dry run touched the proxy: %+v, %v", px, err)
	}
	res, err := e.m.Prune(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"proxy " + proxyName}
	if got := tkKeys(tkPruned(res)); !slices.Equal(got, want) || !slices.Equal(tkKeys(tkPruned(dry)), want) {
		t.Errorf("prune removed %q (dry run %q), want %q", got, tkKeys(tkPruned(dry)), want)
	}
	if _, err := e.rt.InspectVM(ctx, proxyName); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("proxy still there: %v", err)
	}
	if vm, err := e.rt.InspectVM(ctx, p.Names.VM); err != nil || vm.State == sandbox.VMRunning {
		t.Errorf("the stopped VM was touched: %+v, %v", vm, err)
	}
	// The next Create brings VM and proxy back.
	e.create(t, p)
	if px, err := e.rt.InspectVM(ctx, proxyName); err != nil || px.State != sandbox.VMRunning {
		t.Errorf("proxy after Create: %+v, %v", px, err)
	}
}
