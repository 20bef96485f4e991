package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"time"
)

// CreatePlan is what Create would do, computed without changing anything.
type CreatePlan struct {
	// Migration is the dry-run report of the migration from the
	// origin-keyed layout that a real run does first (Found false: none).
	Migration MigrationReport `json:"migration"`
	// LegacyLayout is true when the plan was resolved against a legacy
	// layout still on disk: the state it read is the checkout's merged in
	// memory with the legacy state dir and the legacy VM's home volume.
	LegacyLayout bool           `json:"legacy_layout"`
	Image        PlannedImage   `json:"image"`
	HomeVolume   PlannedVolume  `json:"home_volume"`
	VM           PlannedVM      `json:"vm"`
	Network      string         `json:"network,omitempty"` // the network the VM joins; "" for the engine's default
	Proxy        PlannedProxy   `json:"proxy"`
	Provision    bool           `json:"provision"`    // provisioning would run (the VM is not simply reused)
	AgentDaemon  bool           `json:"agent_daemon"` // the agent's daemon would be checked or started
	Changes      []string       `json:"changes"`      // every change a real run would make, in order, as sentences
	Warnings     []string       `json:"warnings,omitempty"`
	Project      PlannedProject `json:"project"`
}

// PlannedProject names the project the plan is for.
type PlannedProject struct {
	Checkout string `json:"checkout"`
	Repo     string `json:"repo"`
	Agent    string `json:"agent"`
	StateDir string `json:"state_dir"`
}

// PlannedImage says whether the runner image would be built or reused.
type PlannedImage struct {
	Action PlanAction `json:"action"` // reuse or build
	// Custom is true for a project Dockerfile.
	Custom bool `json:"custom,omitempty"`
	// Ref is the tag the VM would be created from: the runner image, or the
	// legacy-prefixed one when that is reused.
	Ref    string `json:"ref"`
	ID     string `json:"id,omitempty"` // the reused image's ID
	Legacy bool   `json:"legacy,omitempty"`
	Hash   string `json:"hash"`
	Reason string `json:"reason"`
}

// PlannedVolume says which home volume would be used.
type PlannedVolume struct {
	Name   string     `json:"name"`
	Action PlanAction `json:"action"` // reuse or create
}

// PlannedVM says what would happen to the VM.
type PlannedVM struct {
	// Name is the VM's name after the run: a reused or started
	// legacy-prefixed VM keeps its name, a recreated one gets the new name.
	Name   string   `json:"name"`
	Action VMAction `json:"action"`
	// Current is the VM that exists now (maybe under the legacy-prefixed
	// name), "" when none does.
	Current string `json:"current,omitempty"`
	Reason  string `json:"reason"`
}

// PlannedProxy says what would happen to the secret proxy.
type PlannedProxy struct {
	Used  bool `json:"used"`  // the VM's egress goes through the proxy
	Start bool `json:"start"` // it would be (re)started
}

// PlanAction says what a plan does with an image or a volume.
type PlanAction string

// Plan actions.
const (
	PlanReuse PlanAction = "reuse"  // an existing one is used as it is
	PlanBuild PlanAction = "build"  // the image is built
	PlanNew   PlanAction = "create" // the volume is created
)

// PlanCreate reports what Create(ctx, p, opts) would do, changing nothing:
// no image, volume, network, VM, state file, lock file or other file is
// touched. It first plans the migration from the origin-keyed layout (see
// MigrateCheckout); while that layout is still there, it resolves against
// it: the home volume the legacy VM mounts or the legacy state records
// counts as this checkout's, and the state the legacy dir holds is merged
// in memory. The engine is only read (inspect and list). For a project
// Dockerfile whose image would be reused, the user the VM runs as is read
// from the existing VM rather than probed with a container.
//
// Errors are those Create would fail with before changing anything
// (invalid configuration, an unknown OCI runtime, an unreadable Dockerfile
// or state) and engine errors.
func (m *Manager) PlanCreate(ctx context.Context, p *Project, opts CreateOptions) (CreatePlan, error) {
	plan := CreatePlan{Changes: []string{}, Project: PlannedProject{Checkout: p.ID.CheckoutSlug, Repo: p.ID.RepoSlug, Agent: p.Names.Agent, StateDir: p.Names.StateDir}}
	mig, view, err := m.migrate(ctx, p.ID, p.Names.Agent, MigrateOptions{DryRun: true})
	if err != nil {
		return plan, err
	}
	plan.Migration = mig
	plan.Warnings = append(plan.Warnings, mig.Warnings...)
	for _, a := range mig.Actions {
		plan.Changes = append(plan.Changes, describeMigration(a, mig.LegacyStateDir))
	}
	if view == nil {
		if view, err = LoadState(p.Names.StateDir); err != nil {
			return plan, err
		}
	} else {
		plan.LegacyLayout = true
	}
	// A copy of the project with the state's secrets, as Open applies them.
	pp := *p
	pp.Config.Secrets = maps.Clone(p.Config.Secrets)
	pp.Origins = maps.Clone(p.Origins)
	applyStateSecrets(&pp, view)

	if err := m.checkOCIRuntime(ctx, &pp); err != nil {
		return plan, err
	}

	// Image.
	img, err := m.planImage(ctx, &pp, opts.Rebuild)
	if err != nil {
		return plan, err
	}
	plan.Image = img
	if img.Action == PlanBuild {
		plan.Changes = append(plan.Changes, fmt.Sprintf("build image %s (%s)", img.Ref, img.Reason))
	}

	// The rest runs Create's own steps against a runtime that records
	// changes instead of making them, on a copy of the state.
	drt, rec := newDryRuntime(m.RT)
	dm := *m
	dm.RT = drt
	as := cloneAgentState(view.Agents[p.Names.Agent])

	vol, created, err := dm.ensureHomeVolume(ctx, &pp, as)
	if err != nil {
		return plan, err
	}
	plan.HomeVolume = PlannedVolume{Name: vol, Action: PlanReuse}
	if created {
		plan.HomeVolume.Action = PlanNew
	}
	eg, err := dm.ensureEgress(ctx, &pp, as)
	if err != nil {
		return plan, err
	}
	plan.Network, plan.Proxy.Used = eg.Network, eg.Proxy
	plan.Changes = append(plan.Changes, rec.changes()...)

	// VM.
	name, vm, err := m.findVM(ctx, &pp)
	if err != nil && !isNotFound(err) {
		return plan, err
	}
	exists := err == nil
	plan.VM = PlannedVM{Name: p.Names.VM, Action: VMCreatedA, Reason: "no VM exists"}
	if exists {
		plan.VM.Current = name
		fp, why := "", ""
		switch {
		case img.Action == PlanBuild:
			why = "the image is rebuilt"
		case vm.ImageID != img.ID:
			why = "it runs another image"
		default:
			// As ensureImage decides it; a project image's user was
			// probed when the VM was made from this very image.
			user := DevUser
			if img.Custom {
				user = vm.Labels[labelUser]
			} else if m.RunAsRoot {
				user = "0:0"
			}
			if _, fp, err = dm.vmSpec(&pp, imageState{Image: Image{ID: img.ID}, Ref: img.Ref, User: user}, vol, eg); err != nil {
				return plan, err
			}
			if vm.Labels[LabelPrint] != fp {
				why = "its configuration changed"
			}
		}
		switch {
		case why != "":
			plan.VM.Action, plan.VM.Reason = VMRecreated, why+" (the home volume is kept)"
		case vm.State == VMRunning:
			plan.VM.Name, plan.VM.Action, plan.VM.Reason = name, VMReused, "it runs with the current configuration"
		default:
			plan.VM.Name, plan.VM.Action, plan.VM.Reason = name, VMStarted, "it is "+string(vm.State)+" with the current configuration"
		}
	}
	reuse := plan.VM.Action == VMReused
	plan.Proxy.Start = eg.Proxy && (!reuse || !m.proxyRunning(ctx, &pp))
	plan.Provision = !reuse
	plan.AgentDaemon = !opts.NoAgentDaemon && len(p.Agent.Serve) > 0

	if plan.Proxy.Start {
		plan.Changes = append(plan.Changes, "start the secret proxy")
	}
	switch plan.VM.Action {
	case VMStarted:
		plan.Changes = append(plan.Changes, "start VM "+plan.VM.Name)
	case VMRecreated:
		plan.Changes = append(plan.Changes, fmt.Sprintf("remove VM %s and create VM %s (%s)", plan.VM.Current, plan.VM.Name, plan.VM.Reason))
	case VMCreatedA:
		plan.Changes = append(plan.Changes, fmt.Sprintf("create VM %s with home volume %s", plan.VM.Name, vol))
	}
	if plan.Provision {
		plan.Changes = append(plan.Changes, "provision the agent's configuration into the VM")
	}
	plan.Changes = append(plan.Changes, "record the VM in "+StateFile(p.Names.StateDir))
	return plan, nil
}

// planImage is the image half of PlanCreate: EnsureImage's reuse check,
// without building.
func (m *Manager) planImage(ctx context.Context, p *Project, rebuild bool) (PlannedImage, error) {
	plan, err := PlanImage(p.ID, p.Config, p.Agent, m.HostUID, m.HostGID)
	if err != nil {
		return PlannedImage{}, err
	}
	withoutBase := plan.WithBaseImageID("").Hash
	baseMissing := false
	if !plan.Custom && plan.BaseImageID == "" {
		base, err := m.RT.InspectImage(ctx, plan.Base)
		switch {
		case err == nil:
			plan = plan.WithBaseImageID(base.ID)
		case errors.Is(err, ErrNotFound):
			baseMissing = true
		default:
			return PlannedImage{}, fmt.Errorf("inspect base image %q: %w", plan.Base, err)
		}
	}
	out := PlannedImage{Action: PlanBuild, Ref: p.Names.RunnerImage, Custom: plan.Custom, Hash: plan.Hash, Reason: "no image of this checkout and agent"}
	if rebuild {
		out.Reason = "a rebuild was asked for"
		return out, nil
	}
	for _, ref := range []string{p.Names.RunnerImage, p.Names.LegacyRunnerImage} {
		img, err := m.RT.InspectImage(ctx, ref)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return PlannedImage{}, fmt.Errorf("inspect image %q: %w", ref, err)
		}
		if img.Labels[LabelHash] == plan.Hash || (baseMissing && img.Labels[LabelHashNoBase] == withoutBase) {
			return PlannedImage{Action: PlanReuse, Ref: ref, ID: img.ID, Custom: plan.Custom, Legacy: ref == p.Names.LegacyRunnerImage, Hash: img.Labels[LabelHash], Reason: "its content hash is current"}, nil
		}
		out.Reason = "what goes into " + ref + " changed"
	}
	return out, nil
}

func cloneAgentState(a *AgentState) *AgentState {
	if a == nil {
		return &AgentState{}
	}
	c := *a
	c.Provisioned = maps.Clone(a.Provisioned)
	c.Placeholders = maps.Clone(a.Placeholders)
	return &c
}

// describeMigration turns a planned migration action into a sentence.
func describeMigration(a MigrationAction, legacyDir string) string {
	switch a.Step {
	case StepRecordVolume:
		return fmt.Sprintf("record home volume %s (%s) in this checkout's state for %s", a.Target, a.Detail, a.Agent)
	case StepDestroyVM:
		return "destroy legacy VM " + a.Target + " (its home volume stays)"
	case StepMergeState:
		return "merge the legacy state.json into this checkout's (" + a.Detail + ")"
	case StepMove:
		return fmt.Sprintf("move %s from %s into this checkout's state dir", a.Target, legacyDir)
	case StepDrop:
		return fmt.Sprintf("remove the legacy %s (%s)", a.Target, a.Detail)
	case StepRemoveDir:
		return "remove the emptied legacy state dir " + a.Target
	}
	return string(a.Step) + " " + a.Target
}

// errDryRun is returned by the dry-run runtime for a change it cannot
// pretend to have made.
var errDryRun = errors.New("dry run: nothing is changed")

// dryRuntime answers reads from the real runtime and records changes
// instead of making them. Creating a volume or a network, connecting a
// network and removing a VM or a network "succeed" (so that the code planned
// can go on); every other
// change fails with errDryRun. It is what PlanCreate runs Create's own
// steps against, not a test double.
type dryRuntime struct {
	rt  Runtime
	mu  sync.Mutex
	rec []string
}

// dryNetRuntime is a dryRuntime over a runtime that manages networks.
type dryNetRuntime struct {
	*dryRuntime
	nw Networker
}

// newDryRuntime wraps rt; the second result reads the recorded changes.
// The wrapper implements Networker exactly when rt does.
func newDryRuntime(rt Runtime) (Runtime, *dryRuntime) {
	d := &dryRuntime{rt: rt}
	if nw, ok := rt.(Networker); ok {
		return &dryNetRuntime{dryRuntime: d, nw: nw}, d
	}
	return d, d
}

func (d *dryRuntime) record(format string, args ...any) {
	d.mu.Lock()
	d.rec = append(d.rec, fmt.Sprintf(format, args...))
	d.mu.Unlock()
}

func (d *dryRuntime) refuse(format string, args ...any) error {
	d.record(format, args...)
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errDryRun)
}

// changes returns what was recorded, in order.
func (d *dryRuntime) changes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string{}, d.rec...)
}

func (d *dryRuntime) Info(ctx context.Context) (RuntimeInfo, error) { return d.rt.Info(ctx) }
func (d *dryRuntime) BuildImage(_ context.Context, req BuildRequest, _ ProgressFunc) (Image, error) {
	return Image{}, d.refuse("build image %v", req.Tags)
}
func (d *dryRuntime) InspectImage(ctx context.Context, ref string) (Image, error) {
	return d.rt.InspectImage(ctx, ref)
}
func (d *dryRuntime) ListImages(ctx context.Context, labels map[string]string) ([]Image, error) {
	return d.rt.ListImages(ctx, labels)
}
func (d *dryRuntime) RemoveImage(_ context.Context, ref string) error {
	return d.refuse("remove image %s", ref)
}
func (d *dryRuntime) PruneBuildCache(context.Context, map[string]string) (int64, error) {
	return 0, d.refuse("prune build cache")
}
func (d *dryRuntime) CreateVolume(_ context.Context, name string, labels map[string]string) (Volume, error) {
	d.record("create volume %s", name)
	return Volume{Name: name, Labels: maps.Clone(labels), Size: -1}, nil
}
func (d *dryRuntime) InspectVolume(ctx context.Context, name string) (Volume, error) {
	return d.rt.InspectVolume(ctx, name)
}
func (d *dryRuntime) ListVolumes(ctx context.Context, labels map[string]string) ([]Volume, error) {
	return d.rt.ListVolumes(ctx, labels)
}
func (d *dryRuntime) RemoveVolume(_ context.Context, name string) error {
	return d.refuse("remove volume %s", name)
}
func (d *dryRuntime) CreateVM(_ context.Context, spec VMSpec) (VM, error) {
	return VM{}, d.refuse("create VM %s", spec.Name)
}
func (d *dryRuntime) StartVM(_ context.Context, name string) error {
	return d.refuse("start VM %s", name)
}
func (d *dryRuntime) StopVM(_ context.Context, name string, _ time.Duration) error {
	return d.refuse("stop VM %s", name)
}
func (d *dryRuntime) KillVM(_ context.Context, name string) error {
	return d.refuse("kill VM %s", name)
}
func (d *dryRuntime) RemoveVM(_ context.Context, name string, _ bool) error {
	// Recorded, not refused: a removal is followed by a create that the
	// plan reports.
	d.record("remove VM %s", name)
	return nil
}
func (d *dryRuntime) InspectVM(ctx context.Context, name string) (VM, error) {
	return d.rt.InspectVM(ctx, name)
}
func (d *dryRuntime) ListVMs(ctx context.Context, labels map[string]string) ([]VM, error) {
	return d.rt.ListVMs(ctx, labels)
}
func (d *dryRuntime) WaitVM(_ context.Context, name string) (int, error) {
	return 0, d.refuse("wait for VM %s", name)
}
func (d *dryRuntime) Exec(_ context.Context, name string, req ExecRequest) (ExecResult, error) {
	return ExecResult{}, d.refuse("run %q in VM %s", req.Cmd, name)
}
func (d *dryRuntime) CopyTo(_ context.Context, name, dir string, _ io.Reader) error {
	return d.refuse("copy files into %s:%s", name, dir)
}
func (d *dryRuntime) CopyFrom(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return d.rt.CopyFrom(ctx, name, path)
}

func (d *dryNetRuntime) CreateNetwork(_ context.Context, spec NetworkSpec) (Network, error) {
	d.record("create network %s", spec.Name)
	return Network{Name: spec.Name, Labels: maps.Clone(spec.Labels), Internal: spec.Internal}, nil
}
func (d *dryNetRuntime) InspectNetwork(ctx context.Context, name string) (Network, error) {
	return d.nw.InspectNetwork(ctx, name)
}
func (d *dryNetRuntime) ListNetworks(ctx context.Context, labels map[string]string) ([]Network, error) {
	return d.nw.ListNetworks(ctx, labels)
}
func (d *dryNetRuntime) RemoveNetwork(_ context.Context, name string) error {
	d.record("remove network %s", name)
	return nil
}
func (d *dryNetRuntime) ConnectNetwork(_ context.Context, network, vm string, _ []string) error {
	d.record("connect VM %s to network %s", vm, network)
	return nil
}

var (
	_ Runtime   = (*dryRuntime)(nil)
	_ Networker = (*dryNetRuntime)(nil)
)
