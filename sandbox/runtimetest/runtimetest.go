// Package runtimetest is the conformance suite every sandbox.Runtime driver
// runs against its real engine:
//
//	func TestConformance(t *testing.T) {
//		testenv.RequireDocker(t)
//		rt := newDriver(t)
//		runtimetest.Run(t, rt, runtimetest.Options{Image: testenv.BusyboxImage(t)})
//	}
//
// Everything the suite creates carries Options.Labels plus a label unique to
// the run, and is removed when the test ends; the suite never touches objects
// it did not create.
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// LabelRun is the label key the suite sets, with a value unique to each Run,
// on every object it creates.
const LabelRun = "org.agents-sandbox.test-run"

// Options configure a Run.
type Options struct {
	// Image is a small image already on the engine whose tools the suite
	// uses: a busybox userland (sh, cat, stat, stty, sleep, wget, httpd, …),
	// such as testenv.BusyboxImage. Builds use it as their base.
	Image string
	// Labels are set on everything the suite creates, next to LabelRun.
	Labels map[string]string
	// CallTimeout bounds each subtest; 0 means 2 minutes.
	CallTimeout time.Duration
}

// suite is the state one Run shares between its subtests.
type suite struct {
	rt     sandbox.Runtime
	opts   Options
	runID  string            // 8 hex digits
	labels map[string]string // opts.Labels + LabelRun
}

// Run runs the whole conformance suite against rt. Independent groups run as
// parallel subtests.
func Run(t *testing.T, rt sandbox.Runtime, opts Options) {
	s := newSuite(t, rt, opts)
	t.Run("Info", s.testInfo)
	t.Run("group", func(t *testing.T) {
		t.Run("Volumes", s.parallel(s.testVolumes))
		t.Run("VMLifecycle", s.parallel(s.testVMLifecycle))
		t.Run("VMSpec", s.parallel(s.testVMSpec))
		t.Run("OCIRuntime", s.parallel(s.testOCIRuntime))
		t.Run("ListVMsByLabel", s.parallel(s.testListVMsByLabel))
		t.Run("Exec", s.parallel(s.testExec))
		t.Run("Copy", s.parallel(s.testCopy))
		t.Run("VolumePersistence", s.parallel(s.testVolumePersistence))
		t.Run("Build", s.parallel(s.testBuild))
		t.Run("PruneBuildCache", s.parallel(s.testPruneBuildCache))
		t.Run("Networks", s.parallel(s.testNetworks))
	})
}

// RunBuild runs only the image build tests: for a driver option that changes
// how images are built (another builder) without changing anything else.
func RunBuild(t *testing.T, rt sandbox.Runtime, opts Options) {
	s := newSuite(t, rt, opts)
	t.Run("Build", s.testBuild)
}

func newSuite(t *testing.T, rt sandbox.Runtime, opts Options) *suite {
	t.Helper()
	if opts.Image == "" {
		t.Fatal("runtimetest: Options.Image is required")
	}
	if opts.CallTimeout == 0 {
		opts.CallTimeout = 2 * time.Minute
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	s := &suite{rt: rt, opts: opts, runID: hex.EncodeToString(b[:])}
	s.labels = maps.Clone(opts.Labels)
	if s.labels == nil {
		s.labels = map[string]string{}
	}
	s.labels[LabelRun] = s.runID
	// Registered first, so it runs last: whatever a failed subtest left
	// behind, found by this run's label only.
	t.Cleanup(func() { s.sweep(t) })
	return s
}

func (s *suite) parallel(f func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) {
		t.Parallel()
		f(t)
	}
}

// ctx is a context for one subtest's calls (not for its cleanups).
func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), s.opts.CallTimeout)
	t.Cleanup(cancel)
	return ctx
}

// cleanupCtx is a context for a cleanup, which runs after t.Context ends.
func cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// name returns a Docker-valid name unique to this run.
func (s *suite) name(what string) string { return "ast-" + s.runID + "-" + what }

// with returns the suite's labels plus extra.
func (s *suite) with(extra map[string]string) map[string]string {
	l := maps.Clone(s.labels)
	maps.Copy(l, extra)
	return l
}

// sweep removes anything carrying this run's label.
func (s *suite) sweep(t *testing.T) {
	ctx, cancel := cleanupCtx()
	defer cancel()
	run := map[string]string{LabelRun: s.runID}
	if vms, err := s.rt.ListVMs(ctx, run); err == nil {
		for _, vm := range vms {
			t.Logf("sweep: removing VM %s left behind", vm.Name)
			_ = s.rt.RemoveVM(ctx, vm.Name, true)
		}
	}
	if nw, ok := s.rt.(sandbox.Networker); ok {
		if nets, err := nw.ListNetworks(ctx, run); err == nil {
			for _, n := range nets {
				t.Logf("sweep: removing network %s left behind", n.Name)
				_ = nw.RemoveNetwork(ctx, n.ID)
			}
		}
	}
	if vols, err := s.rt.ListVolumes(ctx, run); err == nil {
		for _, v := range vols {
			t.Logf("sweep: removing volume %s left behind", v.Name)
			_ = s.rt.RemoveVolume(ctx, v.Name)
		}
	}
	if imgs, err := s.rt.ListImages(ctx, run); err == nil {
		for _, img := range imgs {
			t.Logf("sweep: removing image %s %v left behind", img.ID, img.Tags)
			_ = s.rt.RemoveImage(ctx, img.ID)
		}
	}
}

func (s *suite) testInfo(t *testing.T) {
	info, err := s.rt.Info(s.ctx(t))
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.Name == "" || info.Version == "" || info.OS == "" || info.Arch == "" {
		t.Errorf("Info = %+v: name, version, os and arch must be set", info)
	}
	if info.DefaultOCI != "" && !contains(info.OCIRuntimes, info.DefaultOCI) {
		t.Errorf("Info: default OCI runtime %q not among %v", info.DefaultOCI, info.OCIRuntimes)
	}
	t.Logf("runtime %s %s (API %s) on %s/%s, OCI runtimes %v", info.Name, info.Version, info.APIVersion, info.OS, info.Arch, info.OCIRuntimes)
}

// --- VMs -------------------------------------------------------------------------------------------

// sleeper is a VM command that runs until stopped; with Init it stops at once.
var sleeper = []string{"sleep", "1000000"}

// createVM creates a VM from spec (name and image filled in when empty, the
// suite's labels added) and removes it when t ends.
func (s *suite) createVM(t *testing.T, spec sandbox.VMSpec) sandbox.VM {
	t.Helper()
	if spec.Image == "" {
		spec.Image = s.opts.Image
	}
	if spec.Cmd == nil && spec.Entrypoint == nil {
		spec.Cmd = sleeper
		spec.Init = true
	}
	spec.Labels = s.with(spec.Labels)
	vm, err := s.rt.CreateVM(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("CreateVM %s: %v", spec.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if err := s.rt.RemoveVM(ctx, vm.ID, true); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cleanup: RemoveVM %s: %v", spec.Name, err)
		}
	})
	return vm
}

// startedVM creates and starts a VM.
func (s *suite) startedVM(t *testing.T, spec sandbox.VMSpec) sandbox.VM {
	t.Helper()
	vm := s.createVM(t, spec)
	if err := s.rt.StartVM(s.ctx(t), vm.Name); err != nil {
		t.Fatalf("StartVM %s: %v", vm.Name, err)
	}
	return vm
}

func (s *suite) inspect(t *testing.T, name string) sandbox.VM {
	t.Helper()
	vm, err := s.rt.InspectVM(s.ctx(t), name)
	if err != nil {
		t.Fatalf("InspectVM %s: %v", name, err)
	}
	return vm
}

func (s *suite) testVMLifecycle(t *testing.T) {
	ctx := s.ctx(t)
	name := s.name("life")
	vm := s.createVM(t, sandbox.VMSpec{Name: name, Labels: map[string]string{"org.agents-sandbox.test-role": "life"}})
	if vm.Name != name || vm.ID == "" || vm.State != sandbox.VMCreated {
		t.Fatalf("CreateVM = name %q id %q state %q; want %q, an ID, %q", vm.Name, vm.ID, vm.State, name, sandbox.VMCreated)
	}
	if vm.Labels["org.agents-sandbox.test-role"] != "life" || vm.Labels[LabelRun] != s.runID {
		t.Errorf("CreateVM labels = %v", vm.Labels)
	}
	if vm.Image != s.opts.Image || !strings.HasPrefix(vm.ImageID, "sha256:") {
		t.Errorf("CreateVM image = %q id %q; want %q and a sha256 ID", vm.Image, vm.ImageID, s.opts.Image)
	}
	if vm.Created.IsZero() || !vm.StartedAt.IsZero() {
		t.Errorf("CreateVM created %v started %v; want created set, started zero", vm.Created, vm.StartedAt)
	}

	_, err := s.rt.CreateVM(ctx, sandbox.VMSpec{Name: name, Image: s.opts.Image, Cmd: sleeper, Labels: s.labels})
	if !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("CreateVM with a taken name: err = %v, want ErrConflict", err)
	}

	if err := s.rt.StartVM(ctx, name); err != nil {
		t.Fatalf("StartVM: %v", err)
	}
	got := s.inspect(t, name)
	if got.State != sandbox.VMRunning || got.StartedAt.IsZero() {
		t.Errorf("after StartVM: state %q started %v; want running and a start time", got.State, got.StartedAt)
	}
	if err := s.rt.StartVM(ctx, name); err != nil {
		t.Errorf("StartVM on a running VM: %v, want nil", err)
	}
	if err := s.rt.RemoveVM(ctx, name, false); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("RemoveVM without force on a running VM: err = %v, want ErrConflict", err)
	}

	// A SIGTERM that reaches the init before it runs its child is lost:
	// wait until the sleeper runs (busybox and Debian both have pidof).
	for deadline := time.Now().Add(30 * time.Second); ; {
		r, err := s.rt.Exec(ctx, name, sandbox.ExecRequest{Cmd: []string{"pidof", sleeper[0]}})
		if err == nil && r.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the VM's command %v did not start within 30 s (exec: %v, exit %d)", sleeper, err, r.ExitCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	if err := s.rt.StopVM(ctx, name, 10*time.Second); err != nil {
		t.Fatalf("StopVM: %v", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("StopVM of a VM with an init took %v: SIGTERM was not honoured", d)
	}
	got = s.inspect(t, name)
	if got.State != sandbox.VMStopped || got.FinishedAt.IsZero() {
		t.Errorf("after StopVM: state %q finished %v; want stopped and a finish time", got.State, got.FinishedAt)
	}
	if code, err := s.rt.WaitVM(ctx, name); err != nil {
		t.Errorf("WaitVM on a stopped VM: %v", err)
	} else if code != got.ExitCode {
		t.Errorf("WaitVM = %d, InspectVM exit code %d", code, got.ExitCode)
	}
	if err := s.rt.StopVM(ctx, name, time.Second); err != nil {
		t.Errorf("StopVM on a stopped VM: %v, want nil", err)
	}
	if err := s.rt.KillVM(ctx, name); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("KillVM on a stopped VM: err = %v, want ErrConflict", err)
	}

	if err := s.rt.StartVM(ctx, name); err != nil {
		t.Fatalf("StartVM after stop: %v", err)
	}
	if got := s.inspect(t, name); got.State != sandbox.VMRunning {
		t.Errorf("after second StartVM: state %q", got.State)
	}
	if err := s.rt.KillVM(ctx, name); err != nil {
		t.Errorf("KillVM: %v", err)
	}
	if code, err := s.rt.WaitVM(ctx, name); err != nil || code != 137 {
		t.Errorf("WaitVM after KillVM = %d, %v; want 137", code, err)
	}

	if err := s.rt.RemoveVM(ctx, name, true); err != nil {
		t.Fatalf("RemoveVM: %v", err)
	}
	for what, err := range map[string]error{
		"InspectVM": func() error { _, err := s.rt.InspectVM(ctx, name); return err }(),
		"StartVM":   s.rt.StartVM(ctx, name),
		"StopVM":    s.rt.StopVM(ctx, name, time.Second),
		"RemoveVM":  s.rt.RemoveVM(ctx, name, true),
		"WaitVM":    func() error { _, err := s.rt.WaitVM(ctx, name); return err }(),
		"Exec": func() error {
			_, err := s.rt.Exec(ctx, name, sandbox.ExecRequest{Cmd: []string{"true"}})
			return err
		}(),
	} {
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("%s on a removed VM: err = %v, want ErrNotFound", what, err)
		}
	}
	if vms, err := s.rt.ListVMs(ctx, map[string]string{LabelRun: s.runID, "org.agents-sandbox.test-role": "life"}); err != nil || len(vms) != 0 {
		t.Errorf("ListVMs after remove = %v, %v; want none", vms, err)
	}
}

func (s *suite) testVMSpec(t *testing.T) {
	ctx := s.ctx(t)
	name := s.name("spec")
	vm := s.createVM(t, sandbox.VMSpec{
		Name:        name,
		Hostname:    "spec-host",
		User:        "65534:65534",
		WorkDir:     "/tmp",
		Env:         []string{"AST_ONE=1", "AST_TWO=two words"},
		CapDrop:     []string{"ALL"},
		NoNewPrivs:  true,
		ReadOnlyFS:  true,
		CPUs:        0.5,
		MemoryBytes: 64 << 20,
		PidsLimit:   64,
		ExtraHosts:  []string{"ast-extra.example:192.0.2.7"},
		StopTimeout: 3 * time.Second,
		Mounts:      []sandbox.MountSpec{{Type: "tmpfs", Target: "/scratch"}},
	})
	if err := s.rt.StartVM(ctx, vm.Name); err != nil {
		t.Fatalf("StartVM: %v", err)
	}
	got := s.inspect(t, name)
	if !hasMount(got.Mounts, "tmpfs", "", "/scratch") {
		t.Errorf("InspectVM mounts = %+v; want tmpfs at /scratch", got.Mounts)
	}
	script := `hostname; id -u; id -g; pwd; echo "$AST_ONE|$AST_TWO"; ` +
		`grep -E '^(CapEff|NoNewPrivs):' /proc/self/status | tr -s ' \t' ' '; ` +
		`grep ast-extra.example /etc/hosts | tr -s ' \t' ' '; ` +
		`touch /ro-test 2>/dev/null && echo rootfs-writable || echo rootfs-readonly; ` +
		`touch /scratch/x && echo scratch-writable`
	out, errOut, code := s.exec(t, name, sandbox.ExecRequest{Cmd: []string{"sh", "-c", script}})
	if code != 0 {
		t.Fatalf("exec: exit %d, stderr %q", code, errOut)
	}
	want := []string{
		"spec-host", "65534", "65534", "/tmp", "1|two words",
		"CapEff: 0000000000000000", "NoNewPrivs: 1",
		"192.0.2.7 ast-extra.example", "rootfs-readonly", "scratch-writable",
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, w := range want {
		if i >= len(lines) || strings.TrimSpace(lines[i]) != w {
			t.Errorf("VM sees:\n%s\nwant line %d = %q", out, i+1, w)
			break
		}
	}

	// Resource limits, as the VM's cgroup (v2 or v1) shows them.
	limits := `if [ -f /sys/fs/cgroup/pids.max ]; then
		cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max; cut -d' ' -f1 /sys/fs/cgroup/cpu.max
	elif [ -f /sys/fs/cgroup/pids/pids.max ]; then
		cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us
	else echo no-cgroup; fi`
	out, errOut, code = s.exec(t, name, sandbox.ExecRequest{Cmd: []string{"sh", "-c", limits}})
	switch {
	case code != 0:
		t.Errorf("reading cgroup limits: exit %d: %s", code, errOut)
	case out == "no-cgroup\n":
		t.Logf("no cgroup files in the VM: resource limits not checked")
	case out != "64\n67108864\n50000\n":
		t.Errorf("cgroup limits pids, memory, cpu quota = %q; want 64, 64 MiB, 50000 (0.5 CPU)", out)
	}
}

func (s *suite) testOCIRuntime(t *testing.T) {
	ctx := s.ctx(t)
	info, err := s.rt.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.DefaultOCI != "" {
		vm := s.createVM(t, sandbox.VMSpec{Name: s.name("ociruntime-default")})
		if vm.OCIRuntime != info.DefaultOCI {
			t.Errorf("a VM created without OCIRuntime reports %q, want the default %q", vm.OCIRuntime, info.DefaultOCI)
		}
		vm = s.createVM(t, sandbox.VMSpec{Name: s.name("ociruntime-named"), OCIRuntime: info.DefaultOCI})
		if vm.OCIRuntime != info.DefaultOCI {
			t.Errorf("a VM created with OCIRuntime %q reports %q", info.DefaultOCI, vm.OCIRuntime)
		}
	}
	name := s.name("ociruntime")
	_, err = s.rt.CreateVM(ctx, sandbox.VMSpec{
		Name: name, Image: s.opts.Image, Cmd: sleeper, Labels: s.labels, OCIRuntime: "ast-no-such-runtime",
	})
	if !errors.Is(err, sandbox.ErrInvalid) {
		_ = s.rt.RemoveVM(ctx, name, true)
		t.Fatalf("CreateVM with an unknown OCI runtime: err = %v, want ErrInvalid", err)
	}
	if !strings.Contains(err.Error(), "ast-no-such-runtime") {
		t.Errorf("error %q does not name the runtime", err)
	}
	if info.DefaultOCI != "" && !strings.Contains(err.Error(), info.DefaultOCI) {
		t.Errorf("error %q does not list the available runtimes (%v)", err, info.OCIRuntimes)
	}
	if _, err := s.rt.InspectVM(ctx, name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("InspectVM after the failed create: err = %v, want ErrNotFound (nothing created)", err)
	}
	_, err = s.rt.CreateVM(ctx, sandbox.VMSpec{Name: s.name("noimage"), Image: "agents-sandbox-test/no-such-image:" + s.runID, Labels: s.labels})
	if !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("CreateVM with a missing image: err = %v, want ErrNotFound", err)
	}
}

func (s *suite) testListVMsByLabel(t *testing.T) {
	ctx := s.ctx(t)
	const role = "org.agents-sandbox.test-role"
	a := s.createVM(t, sandbox.VMSpec{Name: s.name("list-a"), Labels: map[string]string{role: "list-a"}})
	s.createVM(t, sandbox.VMSpec{Name: s.name("list-b"), Labels: map[string]string{role: "list-b"}})
	vms, err := s.rt.ListVMs(ctx, map[string]string{LabelRun: s.runID, role: "list-a"})
	if err != nil {
		t.Fatalf("ListVMs: %v", err)
	}
	if len(vms) != 1 || vms[0].Name != a.Name || vms[0].ID != a.ID {
		t.Fatalf("ListVMs(%s=list-a) = %v; want only %s", role, vmNames(vms), a.Name)
	}
	if vms[0].State != sandbox.VMCreated || vms[0].Labels[role] != "list-a" || vms[0].Image != s.opts.Image {
		t.Errorf("ListVMs entry = %+v", vms[0])
	}
	all, err := s.rt.ListVMs(ctx, map[string]string{LabelRun: s.runID, role: "list-none"})
	if err != nil || len(all) != 0 {
		t.Errorf("ListVMs with no match = %v, %v; want none", vmNames(all), err)
	}
}

// --- volumes ---------------------------------------------------------------------------------------

func (s *suite) createVolume(t *testing.T, name string, extra map[string]string) sandbox.Volume {
	t.Helper()
	v, err := s.rt.CreateVolume(s.ctx(t), name, s.with(extra))
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if err := s.rt.RemoveVolume(ctx, name); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cleanup: RemoveVolume %s: %v", name, err)
		}
	})
	return v
}

func (s *suite) testVolumes(t *testing.T) {
	ctx := s.ctx(t)
	const role = "org.agents-sandbox.test-role"
	name := s.name("vol")
	v := s.createVolume(t, name, map[string]string{role: "vol"})
	s.createVolume(t, s.name("vol-other"), map[string]string{role: "vol-other"})
	if v.Name != name || v.Labels[role] != "vol" {
		t.Errorf("CreateVolume = %+v", v)
	}
	got, err := s.rt.InspectVolume(ctx, name)
	if err != nil {
		t.Fatalf("InspectVolume: %v", err)
	}
	if got.Name != name || got.Labels[LabelRun] != s.runID || got.Labels[role] != "vol" {
		t.Errorf("InspectVolume = %+v", got)
	}
	if _, err := s.rt.CreateVolume(ctx, name, s.labels); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("CreateVolume with a taken name: err = %v, want ErrConflict", err)
	}
	list, err := s.rt.ListVolumes(ctx, map[string]string{LabelRun: s.runID, role: "vol"})
	if err != nil {
		t.Fatalf("ListVolumes: %v", err)
	}
	if len(list) != 1 || list[0].Name != name {
		t.Errorf("ListVolumes(%s=vol) = %+v; want only %s", role, list, name)
	}
	if err := s.rt.RemoveVolume(ctx, name); err != nil {
		t.Fatalf("RemoveVolume: %v", err)
	}
	if _, err := s.rt.InspectVolume(ctx, name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("InspectVolume after remove: err = %v, want ErrNotFound", err)
	}
	if err := s.rt.RemoveVolume(ctx, name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("RemoveVolume twice: err = %v, want ErrNotFound", err)
	}
}

func (s *suite) testVolumePersistence(t *testing.T) {
	ctx := s.ctx(t)
	vol := s.name("persist")
	s.createVolume(t, vol, nil)
	spec := sandbox.VMSpec{Name: s.name("persist"), Mounts: []sandbox.MountSpec{{Type: "volume", Source: vol, Target: "/data"}}}
	s.startedVM(t, spec)
	if got := s.inspect(t, spec.Name); !hasMount(got.Mounts, "volume", vol, "/data") {
		t.Errorf("InspectVM mounts = %+v; want volume %s at /data", got.Mounts, vol)
	}
	if _, errOut, code := s.exec(t, spec.Name, sandbox.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /data/f"}}); code != 0 {
		t.Fatalf("write to the volume: exit %d: %s", code, errOut)
	}
	if err := s.rt.RemoveVolume(ctx, vol); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("RemoveVolume while a VM uses it: err = %v, want ErrConflict", err)
	}
	if err := s.rt.RemoveVM(ctx, spec.Name, true); err != nil {
		t.Fatalf("RemoveVM: %v", err)
	}
	s.startedVM(t, spec)
	if out, errOut, code := s.exec(t, spec.Name, sandbox.ExecRequest{Cmd: []string{"cat", "/data/f"}}); code != 0 || out != "kept\n" {
		t.Errorf("the recreated VM reads %q (exit %d, stderr %q); want %q", out, code, errOut, "kept\n")
	}

	// A new volume is seeded from the image's content at its target unless NoCopy.
	for _, noCopy := range []bool{false, true} {
		v := s.name("seed-" + map[bool]string{false: "copy", true: "nocopy"}[noCopy])
		s.createVolume(t, v, nil)
		s.startedVM(t, sandbox.VMSpec{Name: v, Mounts: []sandbox.MountSpec{{Type: "volume", Source: v, Target: "/etc", NoCopy: noCopy}}})
		_, _, code := s.exec(t, v, sandbox.ExecRequest{Cmd: []string{"test", "-e", "/etc/passwd"}})
		if want := map[bool]int{false: 0, true: 1}[noCopy]; code != want {
			t.Errorf("NoCopy=%v: test -e /etc/passwd on the new volume exits %d, want %d", noCopy, code, want)
		}
	}
}

// --- helpers ---------------------------------------------------------------------------------------

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func hasMount(ms []sandbox.MountSpec, typ, source, target string) bool {
	for _, m := range ms {
		if m.Type == typ && m.Target == target && (source == "" || m.Source == source) {
			return true
		}
	}
	return false
}

func vmNames(vms []sandbox.VM) []string {
	var names []string
	for _, vm := range vms {
		names = append(names, vm.Name)
	}
	return names
}
