package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Status is the state of a project's VM for one agent.
type Status struct {
	VM          string    `json:"vm"`
	State       VMState   `json:"state"`
	Image       string    `json:"image"`
	ImageID     string    `json:"image_id,omitempty"`
	HomeVolume  string    `json:"home_volume,omitempty"`
	Created     time.Time `json:"created,omitempty"`
	StartedAt   time.Time `json:"started_at,omitempty"`
	LastUsed    time.Time `json:"last_used,omitempty"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	// UpToDate is false when the next Create would recreate the VM.
	User     string `json:"user,omitempty"`
	Legacy   bool   `json:"legacy,omitempty"`
	Network  string `json:"network,omitempty"`
	Checkout string `json:"checkout"`
	Agent    string `json:"agent"`
}

// Status reports the project VM's state without changing anything. A
// missing VM is State "missing", not an error.
func (m *Manager) Status(ctx context.Context, p *Project) (Status, error) {
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return Status{}, err
	}
	as := st.Agents[p.Names.Agent]
	s := Status{VM: p.Names.VM, State: VMMissing, Image: p.Names.RunnerImage, Checkout: p.ID.CheckoutSlug, Agent: p.Names.Agent}
	if as != nil {
		s.HomeVolume, s.LastUsed = as.HomeVolume, as.LastUsed
	}
	name, vm, err := m.findVM(ctx, p)
	if isNotFound(err) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	s.VM, s.State, s.ImageID, s.Created, s.StartedAt = name, vm.State, vm.ImageID, vm.Created, vm.StartedAt
	s.Fingerprint, s.User = vm.Labels[LabelPrint], vm.Labels[labelUser]
	s.Legacy = name == p.Names.LegacyVM
	for _, mt := range vm.Mounts {
		if mt.Target == HomeDir && mt.Type == "volume" {
			s.HomeVolume = mt.Source
		}
	}
	for n := range vm.Networks {
		s.Network = n
	}
	return s, nil
}

// Stop stops the project VM (SIGTERM, SIGKILL after timeout). A missing or
// already stopped VM is not an error; the result says what it was.
func (m *Manager) Stop(ctx context.Context, p *Project, timeout time.Duration) (Status, error) {
	s, err := m.Status(ctx, p)
	if err != nil || s.State == VMMissing {
		return s, err
	}
	if s.State == VMRunning || s.State == VMPaused {
		if err := m.RT.StopVM(ctx, s.VM, timeout); err != nil {
			return s, fmt.Errorf("stop VM %q: %w", s.VM, err)
		}
	}
	m.stopProxy(ctx, p)
	return m.Status(ctx, p)
}

// Kill kills the project VM at once.
func (m *Manager) Kill(ctx context.Context, p *Project) (Status, error) {
	s, err := m.Status(ctx, p)
	if err != nil || s.State != VMRunning {
		return s, err
	}
	if err := m.RT.KillVM(ctx, s.VM); err != nil {
		return s, fmt.Errorf("kill VM %q: %w", s.VM, err)
	}
	m.stopProxy(ctx, p)
	return m.Status(ctx, p)
}

// RemoveResult says what Remove removed.
type RemoveResult struct {
	Removed []string `json:"removed"` // "vm NAME", "volume NAME", "network NAME"
}

// Remove removes the project VM (running or not) and its proxy and network;
// with volume it also removes the home volume and forgets it in state.
func (m *Manager) Remove(ctx context.Context, p *Project, volume bool) (RemoveResult, error) {
	var res RemoveResult
	lock, err := m.lockVM(ctx, p)
	if err != nil {
		return res, err
	}
	defer lock.Unlock()
	s, err := m.Status(ctx, p)
	if err != nil {
		return res, err
	}
	if s.State != VMMissing {
		if err := m.RT.RemoveVM(ctx, s.VM, true); err != nil && !isNotFound(err) {
			return res, fmt.Errorf("remove VM %q: %w", s.VM, err)
		}
		res.Removed = append(res.Removed, "vm "+s.VM)
	}
	res.Removed = append(res.Removed, m.removeProxy(ctx, p)...)
	if volume {
		st, err := LoadState(p.Names.StateDir)
		if err != nil {
			return res, err
		}
		vols := map[string]bool{}
		if s.HomeVolume != "" {
			vols[s.HomeVolume] = true
		}
		if as := st.Agents[p.Names.Agent]; as != nil && as.HomeVolume != "" {
			vols[as.HomeVolume] = true
		}
		for v := range vols {
			if err := m.RT.RemoveVolume(ctx, v); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("remove home volume %q: %w", v, err)
			}
			res.Removed = append(res.Removed, "volume "+v)
		}
		if as := st.Agents[p.Names.Agent]; as != nil {
			as.HomeVolume, as.Provisioned = "", nil
		}
		if err := SaveState(p.Names.StateDir, st); err != nil {
			return res, err
		}
	}
	sort.Strings(res.Removed)
	return res, nil
}

// ListFilter selects what List returns. Empty fields match everything.
type ListFilter struct {
	Checkout string // checkout slug; empty: every checkout
	Agent    string
	Kind     Kind    // vm or task; empty: both
	State    VMState // running or stopped; empty: both
}

// Listed is one VM or task sandbox as List reports it. Image is the tag of
// the image it runs ("agents-sandbox/runner-…:shell-latest"), or its ID
// when the image has no tag left; LastUsed is the later of its last start
// and stop, and for a project VM the state file's record (the current time
// while it runs).
type Listed struct {
	Name     string            `json:"name"`
	Kind     Kind              `json:"kind"`
	State    VMState           `json:"state"`
	Image    string            `json:"image"`
	Created  time.Time         `json:"created"`
	LastUsed time.Time         `json:"last_used,omitempty"`
	Checkout string            `json:"checkout"`
	Project  string            `json:"project"`
	Agent    string            `json:"agent"`
	Dir      string            `json:"dir,omitempty"`
	Labels   map[string]string `json:"labels"`
}

// List returns the VMs (kind vm) and task sandboxes (kind task)
// agents-sandbox made, found by label and filtered by f, newest first. It
// inspects each one for its start and stop times. Errors: the engine's.
func (m *Manager) List(ctx context.Context, f ListFilter) ([]Listed, error) {
	var out []Listed
	kinds := []Kind{KindVM, KindTask}
	if f.Kind != "" {
		kinds = []Kind{f.Kind}
	}
	// VMs are created from an image ID; show the image's tag instead.
	tags := map[string]string{}
	imageName := func(vm VM) string {
		if !strings.HasPrefix(vm.Image, "sha256:") {
			return vm.Image
		}
		if n, ok := tags[vm.ImageID]; ok {
			return n
		}
		n := vm.Image
		if img, err := m.RT.InspectImage(ctx, vm.ImageID); err == nil {
			if tags := realTags(img.Tags); len(tags) > 0 {
				n = tags[0]
			}
		}
		tags[vm.ImageID] = n
		return n
	}
	for _, k := range kinds {
		labels := map[string]string{LabelKind: string(k)}
		if f.Checkout != "" {
			labels[LabelCheckout] = f.Checkout
		}
		if f.Agent != "" {
			labels[LabelAgent] = SanitizeName(f.Agent)
		}
		vms, err := m.RT.ListVMs(ctx, labels)
		if err != nil {
			return nil, err
		}
		for _, vm := range vms {
			if f.State != "" && !stateMatches(f.State, vm.State) {
				continue
			}
			vm = m.withTimes(ctx, vm)
			l := Listed{Name: vm.Name, Kind: k, State: vm.State, Image: imageName(vm), Created: vm.Created,
				Checkout: vm.Labels[LabelCheckout], Project: vm.Labels[LabelProject], Agent: vm.Labels[LabelAgent],
				Dir: vm.Labels[LabelDir], Labels: vm.Labels}
			l.LastUsed = m.lastUsed(vm)
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.After(out[j].Created) })
	return out, nil
}

func stateMatches(want, got VMState) bool {
	if want == VMStopped {
		return got != VMRunning && got != VMPaused
	}
	return want == got
}

// withTimes fills in the start and finish times a listed VM lacks (the
// list API of some engines does not report them) by inspecting it. When the
// inspect fails (the VM is gone) the VM is returned as it was.
func (m *Manager) withTimes(ctx context.Context, vm VM) VM {
	if !vm.StartedAt.IsZero() || !vm.FinishedAt.IsZero() {
		return vm
	}
	full, err := m.RT.InspectVM(ctx, vm.Name)
	if err != nil {
		return vm
	}
	vm.StartedAt, vm.FinishedAt, vm.ExitCode = full.StartedAt, full.FinishedAt, full.ExitCode
	return vm
}

// lastUsed is the latest of the VM's last start and stop and, for a
// project VM, the state file's record; the current time for a running VM;
// its creation time when nothing else is known.
func (m *Manager) lastUsed(vm VM) time.Time {
	t := vm.StartedAt
	if vm.FinishedAt.After(t) {
		t = vm.FinishedAt
	}
	if vm.State == VMRunning {
		t = m.now()
	}
	if kindOf(vm.Labels) == KindVM {
		if as := m.stateFor(vm.Labels); as != nil && as.LastUsed.After(t) {
			t = as.LastUsed
		}
	}
	if t.IsZero() {
		t = vm.Created
	}
	return t
}

func kindOf(labels map[string]string) Kind { return Kind(labels[LabelKind]) }
