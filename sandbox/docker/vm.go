package docker

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// CreateVM creates (does not start) a container for spec and returns it as
// InspectVM would.
//
// Errors: ErrInvalid for a bad spec (no name or image, an unknown mount
// type, aliases without a network, a bind source that does not exist) and
// for an OCI runtime the engine has not registered — checked against the
// engine's runtimes before anything is created, the error listing the ones
// it has; ErrNotFound when the image or network does not exist; ErrConflict
// when the name is taken.
func (d *Driver) CreateVM(ctx context.Context, spec sandbox.VMSpec) (sandbox.VM, error) {
	op := fmt.Sprintf("create VM %q", spec.Name)
	if spec.Name == "" || spec.Image == "" {
		return sandbox.VM{}, fmt.Errorf("%s: %w: a VM needs a name and an image", op, sandbox.ErrInvalid)
	}
	if spec.OCIRuntime != "" {
		if err := d.checkOCIRuntime(ctx, spec.OCIRuntime); err != nil {
			return sandbox.VM{}, fmt.Errorf("%s: %w", op, err)
		}
	}
	mounts, err := toMounts(spec.Mounts)
	if err != nil {
		return sandbox.VM{}, fmt.Errorf("%s: %w", op, err)
	}
	cfg := &container.Config{
		Image:      spec.Image,
		Hostname:   spec.Hostname,
		User:       spec.User,
		WorkingDir: spec.WorkDir,
		Env:        spec.Env,
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Cmd,
		Labels:     spec.Labels,
	}
	if spec.StopTimeout > 0 {
		secs := int(math.Ceil(spec.StopTimeout.Seconds()))
		cfg.StopTimeout = &secs
	}
	hc := &container.HostConfig{
		Mounts:         mounts,
		CapDrop:        spec.CapDrop,
		CapAdd:         spec.CapAdd,
		ReadonlyRootfs: spec.ReadOnlyFS,
		Runtime:        spec.OCIRuntime,
		ExtraHosts:     spec.ExtraHosts,
		Resources: container.Resources{
			NanoCPUs: int64(math.Round(spec.CPUs * 1e9)),
			Memory:   spec.MemoryBytes,
		},
	}
	if spec.NoNewPrivs {
		hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges:true")
	}
	if spec.PidsLimit > 0 {
		hc.PidsLimit = &spec.PidsLimit
	}
	if spec.Init {
		init := true
		hc.Init = &init
	}
	var netCfg *network.NetworkingConfig
	if spec.Network != "" {
		hc.NetworkMode = container.NetworkMode(spec.Network)
		if len(spec.NetworkAliases) > 0 {
			netCfg = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
				spec.Network: {Aliases: slices.Clone(spec.NetworkAliases)},
			}}
		}
	} else if len(spec.NetworkAliases) > 0 {
		return sandbox.VM{}, fmt.Errorf("%s: %w: network aliases need a network", op, sandbox.ErrInvalid)
	}
	res, err := d.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:             spec.Name,
		Config:           cfg,
		HostConfig:       hc,
		NetworkingConfig: netCfg,
	})
	if err != nil {
		return sandbox.VM{}, d.wrap(op, err)
	}
	for _, w := range res.Warnings {
		d.log.Warn().Str("vm", spec.Name).Msg(w)
	}
	vm, err := d.InspectVM(ctx, res.ID)
	if err != nil {
		return sandbox.VM{}, fmt.Errorf("%s: %w", op, err)
	}
	return vm, nil
}

// checkOCIRuntime returns an error wrapping ErrInvalid when the engine has no
// OCI runtime of that name.
func (d *Driver) checkOCIRuntime(ctx context.Context, name string) error {
	info, err := d.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return d.wrap("read the engine's OCI runtimes", err)
	}
	if _, ok := info.Info.Runtimes[name]; ok {
		return nil
	}
	return fmt.Errorf("%w: OCI runtime %q is not registered with the Docker engine (available: %s); register it under \"runtimes\" in /etc/docker/daemon.json and restart dockerd, or pick another",
		sandbox.ErrInvalid, name, strings.Join(runtimeNames(info.Info.Runtimes), ", "))
}

func toMounts(specs []sandbox.MountSpec) ([]mount.Mount, error) {
	out := make([]mount.Mount, 0, len(specs))
	for _, m := range specs {
		mm := mount.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly}
		switch m.Type {
		case "bind":
			mm.Type = mount.TypeBind
		case "volume":
			mm.Type = mount.TypeVolume
			if m.NoCopy {
				mm.VolumeOptions = &mount.VolumeOptions{NoCopy: true}
			}
		case "tmpfs":
			mm.Type = mount.TypeTmpfs
			mm.Source = ""
		default:
			return nil, fmt.Errorf("mount %q: %w: type %q (want bind, volume or tmpfs)", m.Target, sandbox.ErrInvalid, m.Type)
		}
		if !strings.HasPrefix(m.Target, "/") {
			return nil, fmt.Errorf("mount %q: %w: the target must be an absolute path", m.Target, sandbox.ErrInvalid)
		}
		out = append(out, mm)
	}
	return out, nil
}

// StartVM starts a created or stopped VM; starting a running one does nothing.
func (d *Driver) StartVM(ctx context.Context, name string) error {
	_, err := d.cli.ContainerStart(ctx, name, client.ContainerStartOptions{})
	return d.wrap(fmt.Sprintf("start VM %q", name), err)
}

// StopVM sends SIGTERM (or the image's stop signal), then SIGKILL after
// timeout, rounded up to whole seconds; a negative timeout uses the VM's own
// StopTimeout. Stopping a stopped VM does nothing.
func (d *Driver) StopVM(ctx context.Context, name string, timeout time.Duration) error {
	var opts client.ContainerStopOptions
	if timeout >= 0 {
		secs := int(math.Ceil(timeout.Seconds()))
		opts.Timeout = &secs
	}
	_, err := d.cli.ContainerStop(ctx, name, opts)
	return d.wrap(fmt.Sprintf("stop VM %q", name), err)
}

// KillVM sends SIGKILL (ErrConflict when the VM is not running).
func (d *Driver) KillVM(ctx context.Context, name string) error {
	_, err := d.cli.ContainerKill(ctx, name, client.ContainerKillOptions{Signal: "KILL"})
	return d.wrap(fmt.Sprintf("kill VM %q", name), err)
}

// RemoveVM removes a VM and its anonymous volumes; named volumes stay.
// Without force a running VM gives ErrConflict.
func (d *Driver) RemoveVM(ctx context.Context, name string, force bool) error {
	_, err := d.cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: force, RemoveVolumes: true})
	return d.wrap(fmt.Sprintf("remove VM %q", name), err)
}

// InspectVM returns the VM with that name or ID (ErrNotFound).
func (d *Driver) InspectVM(ctx context.Context, name string) (sandbox.VM, error) {
	res, err := d.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		return sandbox.VM{}, d.wrap(fmt.Sprintf("inspect VM %q", name), err)
	}
	c := res.Container
	vm := sandbox.VM{
		ID:      c.ID,
		Name:    strings.TrimPrefix(c.Name, "/"),
		ImageID: c.Image,
		Created: parseTime(c.Created),
		Mounts:  toMountSpecs(c.Mounts),
	}
	if c.Config != nil {
		vm.Image = c.Config.Image
		vm.Labels = maps.Clone(c.Config.Labels)
	}
	if c.HostConfig != nil {
		vm.OCIRuntime = c.HostConfig.Runtime
	}
	if s := c.State; s != nil {
		vm.State = toVMState(string(s.Status))
		vm.StartedAt = parseTime(s.StartedAt)
		vm.FinishedAt = parseTime(s.FinishedAt)
		vm.ExitCode = s.ExitCode
	}
	if c.NetworkSettings != nil {
		vm.Networks = toNetworks(c.NetworkSettings.Networks)
	}
	return vm, nil
}

// ListVMs returns the VMs, running or not, carrying all the given labels
// (filtered by the engine). The list API does not report StartedAt,
// FinishedAt, ExitCode or OCIRuntime; InspectVM does.
func (d *Driver) ListVMs(ctx context.Context, labels map[string]string) ([]sandbox.VM, error) {
	res, err := d.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: labelFilters(labels)})
	if err != nil {
		return nil, d.wrap("list VMs", err)
	}
	out := make([]sandbox.VM, 0, len(res.Items))
	for _, c := range res.Items {
		vm := sandbox.VM{
			ID:      c.ID,
			Image:   c.Image,
			ImageID: c.ImageID,
			State:   toVMState(string(c.State)),
			Labels:  maps.Clone(c.Labels),
			Created: time.Unix(c.Created, 0).UTC(),
			Mounts:  toMountSpecs(c.Mounts),
		}
		if len(c.Names) > 0 {
			vm.Name = strings.TrimPrefix(c.Names[0], "/")
		}
		if c.NetworkSettings != nil {
			vm.Networks = toNetworks(c.NetworkSettings.Networks)
		}
		out = append(out, vm)
	}
	return out, nil
}

// WaitVM blocks until the VM is not running (returning at once for a created
// or stopped one) and returns its exit code.
func (d *Driver) WaitVM(ctx context.Context, name string) (int, error) {
	op := fmt.Sprintf("wait for VM %q", name)
	res := d.cli.ContainerWait(ctx, name, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case r := <-res.Result:
		if r.Error != nil && r.Error.Message != "" {
			return int(r.StatusCode), fmt.Errorf("%s: %s", op, r.Error.Message)
		}
		return int(r.StatusCode), nil
	case err := <-res.Error:
		return 0, d.wrap(op, err)
	case <-ctx.Done():
		return 0, fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

func toVMState(s string) sandbox.VMState {
	switch container.ContainerState(s) {
	case container.StateCreated:
		return sandbox.VMCreated
	case container.StateRunning, container.StateRestarting:
		return sandbox.VMRunning
	case container.StatePaused:
		return sandbox.VMPaused
	case container.StateExited, container.StateDead, container.StateRemoving:
		return sandbox.VMStopped
	}
	return sandbox.VMState(s)
}

func toMountSpecs(mps []container.MountPoint) []sandbox.MountSpec {
	if len(mps) == 0 {
		return nil
	}
	out := make([]sandbox.MountSpec, 0, len(mps))
	for _, m := range mps {
		ms := sandbox.MountSpec{Type: string(m.Type), Source: m.Source, Target: m.Destination, ReadOnly: !m.RW}
		if m.Type == mount.TypeVolume {
			ms.Source = m.Name
		}
		out = append(out, ms)
	}
	return out
}

func toNetworks(eps map[string]*network.EndpointSettings) map[string]string {
	if len(eps) == 0 {
		return nil
	}
	out := make(map[string]string, len(eps))
	for name, ep := range eps {
		var ip netip.Addr
		if ep != nil {
			ip = ep.IPAddress
		}
		if ip.IsValid() {
			out[name] = ip.String()
		} else {
			out[name] = ""
		}
	}
	return out
}
