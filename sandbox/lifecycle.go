package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Create makes sure the project's image, home volume and VM exist and the VM
// runs, then provisions it and starts the agent's daemon. It is what every
// run does first; on the fast path (image current, VM running) it costs one
// inspect of the image and one of the VM.
//
// The VM is created under the checkout's lock and re-checked after taking
// it, so racing callers end with one VM and one home volume. A changed
// fingerprint recreates the VM and keeps the home volume.
func (m *Manager) Create(ctx context.Context, p *Project, opts CreateOptions) (CreateResult, error) {
	t := newTimer()
	res := CreateResult{VM: p.Names.VM, Image: p.Names.RunnerImage}

	if err := m.checkOCIRuntime(ctx, p); err != nil {
		return res, err
	}

	// Image.
	t0 := time.Now()
	img, err := m.ensureImage(ctx, p, opts)
	if err != nil {
		return res, err
	}
	t.since("image", t0)
	res.ImageID, res.ImageBuilt = img.Image.ID, img.Built
	if img.Ref != "" {
		res.Image = img.Ref
	}
	res.User = img.User

	lock, err := m.lockVM(ctx, p)
	if err != nil {
		return res, fmt.Errorf("create %s: %w", p.Names.VM, err)
	}
	defer lock.Unlock()

	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return res, err
	}
	as := st.Agent(p.Names.Agent)

	// Home volume.
	t0 = time.Now()
	vol, created, err := m.ensureHomeVolume(ctx, p, as)
	if err != nil {
		return res, err
	}
	res.HomeVolume, res.VolumeCreated = vol, created
	if created || vol != as.HomeVolume {
		// Another volume holds none of what provisioning wrote before:
		// forget it, or the sync would find everything "unchanged" and
		// write nothing.
		as.Provisioned = nil
	}
	t.since("volume", t0)

	// Egress (network + proxy) comes before the VM spec: it decides the
	// network and the env the VM sees.
	t0 = time.Now()
	eg, err := m.ensureEgress(ctx, p, as)
	if err != nil {
		return res, err
	}
	t.since("egress", t0)

	spec, fp, err := m.vmSpec(p, img, vol, eg)
	if err != nil {
		return res, err
	}

	// VM: reuse, start, create or recreate.
	t0 = time.Now()
	name, vm, err := m.findVM(ctx, p)
	if err != nil && !isNotFound(err) {
		return res, err
	}
	reuse := err == nil && vm.Labels[LabelPrint] == fp && vm.State == VMRunning
	if eg.Proxy && (!reuse || !m.proxyRunning(ctx, p)) {
		// The proxy reads the secret values afresh whenever the VM starts.
		tp := time.Now()
		if err := m.startProxy(ctx, p, as); err != nil {
			return res, err
		}
		t.since("proxy", tp)
	}
	switch {
	case err == nil && vm.Labels[LabelPrint] == fp:
		res.VM = name
		if vm.State == VMRunning {
			res.Action = VMReused
		} else {
			if err := m.RT.StartVM(ctx, name); err != nil {
				return res, fmt.Errorf("start VM %q: %w", name, err)
			}
			res.Action = VMStarted
		}
	case err == nil:
		m.Log.Info().Str("vm", name).Msg("configuration changed: recreating the VM (the home volume is kept)")
		if err := m.RT.RemoveVM(ctx, name, true); err != nil && !isNotFound(err) {
			return res, fmt.Errorf("remove VM %q for recreate: %w", name, err)
		}
		if err := m.createVM(ctx, spec); err != nil {
			return res, err
		}
		res.Action = VMRecreated
	default:
		if err := m.createVM(ctx, spec); err != nil {
			return res, err
		}
		res.Action = VMCreatedA
	}
	t.since("vm", t0)

	as.VM = res.VM
	as.HomeVolume = vol
	as.ImageID = img.Image.ID
	as.Fingerprint = fp
	as.LastUsed = m.now().UTC()
	if res.Action == VMCreatedA || res.Action == VMRecreated {
		as.CreatedAt = as.LastUsed
	}
	if err := SaveState(p.Names.StateDir, st); err != nil {
		return res, err
	}

	if res.Action != VMReused {
		t0 = time.Now()
		if err := m.waitReady(ctx, res.VM); err != nil {
			return res, err
		}
		if eg.Proxy {
			if err := m.installProxyCA(ctx, p, res.VM); err != nil {
				return res, err
			}
		}
		pr, err := m.provisionLocked(ctx, p, st, res.VM, img.User, true, opts.Progress)
		if err != nil {
			return res, err
		}
		res.Provision = &pr
		t.since("provision", t0)
	}
	if !opts.NoAgentDaemon && len(p.Agent.Serve) > 0 {
		t0 = time.Now()
		if err := m.ensureDaemon(ctx, p, res.VM, img.User, false); err != nil {
			return res, err
		}
		t.since("daemon", t0)
	}
	res.TimingsMS = t.total()
	return res, nil
}

// imageState is the image a VM runs and the user it runs as.
type imageState struct {
	Image Image
	Ref   string
	Built bool
	User  string // "dev" or the image's user
}

// ensureImage plans and ensures the runner image under the checkout's
// per-agent image lock (EnsureImage wants its caller to hold one): racing
// callers then build once, and the later ones find the image current
// instead of building a second one that moves the tag and leaves the first
// dangling (and a VM made from it recreated at once).
func (m *Manager) ensureImage(ctx context.Context, p *Project, opts CreateOptions) (imageState, error) {
	ir, err := m.ensureRunnerImage(ctx, p, opts.Rebuild, opts.Progress)
	if err != nil {
		return imageState{}, err
	}
	user := ir.User
	if m.RunAsRoot && (user == "dev" || user == "") {
		user = "0:0"
	}
	return imageState{Image: ir.Image, Ref: ir.Ref, Built: ir.Built, User: user}, nil
}

// checkOCIRuntime refuses an OCI runtime the engine does not have, before
// anything is built or created.
func (m *Manager) checkOCIRuntime(ctx context.Context, p *Project) error {
	want := p.Config.OCIRuntime
	if want == "" {
		return nil
	}
	info, err := m.RT.Info(ctx)
	if err != nil {
		return err
	}
	for _, r := range info.OCIRuntimes {
		if r == want {
			return nil
		}
	}
	return fmt.Errorf("oci_runtime %q: %w: the engine has no such runtime (it has: %s); install and register it with the engine, or remove oci_runtime from the config", want, ErrInvalid, strings.Join(info.OCIRuntimes, ", "))
}

// findVM finds the project VM by its name, then by its legacy name.
func (m *Manager) findVM(ctx context.Context, p *Project) (string, VM, error) {
	vm, err := m.RT.InspectVM(ctx, p.Names.VM)
	if err == nil {
		return p.Names.VM, vm, nil
	}
	if !isNotFound(err) {
		return "", VM{}, err
	}
	vm, lerr := m.RT.InspectVM(ctx, p.Names.LegacyVM)
	if lerr == nil {
		return p.Names.LegacyVM, vm, nil
	}
	return "", VM{}, err
}

// ensureHomeVolume returns the home volume recorded in state if it still
// exists, else a labelled one of this checkout and agent, else a new one.
func (m *Manager) ensureHomeVolume(ctx context.Context, p *Project, as *AgentState) (string, bool, error) {
	if as.HomeVolume != "" {
		if _, err := m.RT.InspectVolume(ctx, as.HomeVolume); err == nil {
			return as.HomeVolume, false, nil
		} else if !isNotFound(err) {
			return "", false, err
		}
		m.Log.Warn().Str("volume", as.HomeVolume).Msg("the home volume recorded in state is gone; looking for another")
	}
	vols, err := m.RT.ListVolumes(ctx, map[string]string{LabelCheckout: p.ID.CheckoutSlug, LabelAgent: p.Names.Agent, LabelKind: string(KindHome)})
	if err != nil {
		return "", false, err
	}
	if len(vols) > 0 {
		sort.Slice(vols, func(i, j int) bool { return vols[i].Name > vols[j].Name })
		return vols[0].Name, false, nil
	}
	name := p.Names.HomeVolumeName(m.now())
	if _, err := m.RT.CreateVolume(ctx, name, p.ID.Labels(p.Names.Agent, KindHome)); err != nil {
		return "", false, fmt.Errorf("create home volume %q: %w", name, err)
	}
	return name, true, nil
}

// vmSpec builds the VM's spec and fingerprint.
func (m *Manager) vmSpec(p *Project, img imageState, vol string, eg egress) (VMSpec, string, error) {
	cfg := p.Config
	env := map[string]string{}
	for k, v := range cfg.Env {
		env[k] = v
	}
	for k, v := range eg.Env {
		env[k] = v
	}
	env["AGENTS_SANDBOX"] = "1"
	env["AGENTS_SANDBOX_CHECKOUT"] = p.ID.CheckoutSlug
	env["HOME"] = HomeDir

	mounts := []MountSpec{
		{Type: "bind", Source: p.ID.ProjectDir, Target: Workspace},
		{Type: "volume", Source: vol, Target: HomeDir},
	}
	if p.ID.Git && p.ID.GitCommonDir != "" {
		// Read-only: worktree sessions fetch from it (worktree.go), and
		// nothing in the VM can write the host's .git through it.
		mounts = append(mounts, MountSpec{Type: "bind", Source: p.ID.GitCommonDir, Target: HostGitDir, ReadOnly: true})
	}
	for _, mt := range cfg.Mounts {
		src := expandHome(mt.Source, m.Environ)
		if _, err := os.Stat(src); err != nil {
			return VMSpec{}, "", fmt.Errorf("mounts: source %q: %w: %v; create it or remove the mount", mt.Source, ErrInvalid, err)
		}
		mounts = append(mounts, MountSpec{Type: "bind", Source: src, Target: mt.Target, ReadOnly: mt.ReadOnly})
	}
	var mem int64
	if cfg.Resources.Memory != "" {
		mem, _ = ParseBytes(cfg.Resources.Memory)
	}
	idle := cfg.IdleTimeout.Duration
	initHash, err := m.initHash()
	if err != nil {
		return VMSpec{}, "", fmt.Errorf("init binary %q: %w (build agents-sandbox statically and run that binary)", m.InitBinary, err)
	}
	labels := p.ID.Labels(p.Names.Agent, KindVM)
	labels[LabelDir] = p.ID.ProjectDir

	var mountKeys []string
	for _, mt := range mounts {
		mountKeys = append(mountKeys, fmt.Sprintf("%s:%s:%s:%v", mt.Type, mt.Source, mt.Target, mt.ReadOnly))
	}
	var secretKeys []string
	for name, s := range cfg.Secrets {
		secretKeys = append(secretKeys, name+"="+strings.Join(s.Hosts, ",")+fmt.Sprintf(":%v:%v", s.Body, s.AllowAnyHostDangerous))
	}
	sort.Strings(secretKeys)
	fp := fingerprint(
		"image="+img.Image.ID,
		"user="+img.User,
		"env="+strings.Join(sortedKV(env), "\x00"),
		"mounts="+strings.Join(mountKeys, "\x00"),
		"network="+eg.Network+":"+string(cfg.Network.Mode)+":"+strings.Join(cfg.Network.Allow, ",")+":"+strings.Join(cfg.Network.Deny, ","),
		"resources="+fmt.Sprintf("%v:%d:%d", cfg.Resources.CPUs, mem, cfg.Resources.Pids),
		"secrets="+strings.Join(secretKeys, ","),
		"oci="+cfg.OCIRuntime,
		"idle="+idle.String(),
		"init="+initHash,
		"secretenv="+fingerprint(sortedKV(eg.SecretEnv)...),
	)
	labels[LabelPrint] = fp
	labels[labelUser] = img.User

	for k, v := range eg.SecretEnv {
		env[k] = v
	}
	spec := VMSpec{
		Name:        p.Names.VM,
		Image:       img.Image.ID,
		Labels:      labels,
		Env:         sortedKV(env),
		Entrypoint:  []string{InitPath, "vm-init", "--idle-timeout", idle.String()},
		Cmd:         []string{},
		User:        "0:0",
		WorkDir:     Workspace,
		Hostname:    hostnameFor(p),
		Mounts:      mounts,
		Network:     eg.Network,
		CapDrop:     []string{"ALL"},
		CapAdd:      []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"},
		NoNewPrivs:  true,
		CPUs:        cfg.Resources.CPUs,
		MemoryBytes: mem,
		PidsLimit:   cfg.Resources.Pids,
		OCIRuntime:  cfg.OCIRuntime,
		ExtraHosts:  eg.ExtraHosts,
		StopTimeout: 10 * time.Second,
	}
	return spec, fp, nil
}

func hostnameFor(p *Project) string {
	h := SanitizeName(p.ID.ProjectDir[strings.LastIndex(p.ID.ProjectDir, "/")+1:])
	if len(h) > 63 {
		h = h[:63]
	}
	return h
}

// createVM creates the VM, copies the init binary in and starts it. On any
// failure after create, the half-made VM is removed.
func (m *Manager) createVM(ctx context.Context, spec VMSpec) (err error) {
	if _, err := m.RT.CreateVM(ctx, spec); err != nil {
		return fmt.Errorf("create VM %q: %w", spec.Name, err)
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = m.RT.RemoveVM(rctx, spec.Name, true)
		}
	}()
	tr, err := initTar(m.InitBinary)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := m.RT.CopyTo(ctx, spec.Name, "/", tr); err != nil {
		return fmt.Errorf("copy init binary into VM %q: %w", spec.Name, err)
	}
	if err := m.RT.StartVM(ctx, spec.Name); err != nil {
		return fmt.Errorf("start VM %q: %w", spec.Name, err)
	}
	return nil
}

// initTar is a tar holding the init binary at InitPath (root-owned, 0755).
// The binary must be a static linux executable: it runs inside images that
// may have no C library.
func initTar(bin string) (io.ReadCloser, error) {
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	f, err := os.Open(bin)
	if err != nil {
		return nil, fmt.Errorf("read init binary %q: %w", bin, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read init binary %q: %w", bin, err)
	}
	// Streamed through a pipe: the binary is tens of MiB, and many VMs
	// may start at once.
	pr, pw := io.Pipe()
	go func() {
		defer f.Close()
		tw := tar.NewWriter(pw)
		err := func() error {
			for _, d := range []string{"usr/", "usr/local/", "usr/local/lib/", "usr/local/lib/agents-sandbox/"} {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
					return err
				}
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(InitPath, "/"), Mode: 0o755, Size: fi.Size(), ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
				return fmt.Errorf("read init binary %q: %w", bin, err)
			}
			return tw.Close()
		}()
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// initHash returns the SHA-256 of the init binary, cached by path, size and
// modification time (hashing tens of MiB on every Create would dominate its
// fast path).
func (m *Manager) initHash() (string, error) {
	fi, err := os.Stat(m.InitBinary)
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", m.InitBinary, fi.Size(), fi.ModTime().UnixNano())
	if m.hashes != nil {
		if v, ok := m.hashes.Load(key); ok {
			return v.(string), nil
		}
	}
	h, err := fileSHA256(m.InitBinary)
	if err != nil {
		return "", err
	}
	if m.hashes != nil {
		m.hashes.Store(key, h)
	}
	return h, nil
}

// waitReady waits until the VM answers an exec of its init binary.
func (m *Manager) waitReady(ctx context.Context, vm string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		var stderr bytes.Buffer
		r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{InitPath, "vm-status"}, User: "0:0", Stderr: &stderr})
		if err == nil && r.ExitCode == 0 {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("exit %d: %s", r.ExitCode, strings.TrimSpace(stderr.String()))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("VM %q did not become ready: %w (last: %v)", vm, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func expandHome(p string, environ []string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		home := ""
		for _, kv := range environ {
			if strings.HasPrefix(kv, "HOME=") {
				home = kv[5:]
			}
		}
		if home == "" {
			home, _ = os.UserHomeDir()
		}
		return home + p[1:]
	}
	return p
}

// checkStatic refuses a binary that is not a static linux ELF executable.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("init binary %q: %w: not a linux executable (%v); run a linux build of agents-sandbox", bin, ErrInvalid, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("init binary %q: %w: it is dynamically linked, but it must run inside the VM; build it with CGO_ENABLED=0 (just build, or install.sh)", bin, ErrInvalid)
		}
	}
	return nil
}

// Build makes sure the project's runner image is current (building it when
// its content hash changed, or always with rebuild) under the same lock
// Create uses, and reports what it did.
func (m *Manager) Build(ctx context.Context, p *Project, rebuild bool, progress ProgressFunc) (ImageResult, error) {
	if err := m.checkOCIRuntime(ctx, p); err != nil {
		return ImageResult{}, err
	}
	return m.ensureRunnerImage(ctx, p, rebuild, progress)
}

// ensureRunnerImage plans the project's image and runs EnsureImage under
// the checkout's per-agent image lock.
func (m *Manager) ensureRunnerImage(ctx context.Context, p *Project, rebuild bool, progress ProgressFunc) (ImageResult, error) {
	plan, err := PlanImage(p.ID, p.Config, p.Agent, m.HostUID, m.HostGID)
	if err != nil {
		return ImageResult{}, err
	}
	lock, err := AcquireLock(ctx, LockFile(p.Names.StateDir, "image-"+p.Names.Agent))
	if err != nil {
		return ImageResult{}, fmt.Errorf("image %s: %w", p.Names.RunnerImage, err)
	}
	defer lock.Unlock()
	return EnsureImage(ctx, m.RT, p.ID, p.Names, plan, rebuild, progress)
}
