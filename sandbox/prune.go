package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PruneOptions select what Prune removes.
type PruneOptions struct {
	// Age: VMs unused for longer than this are removed (default 7 days).
	Age time.Duration
	// Volumes also removes the home volumes of the VMs removed, and home
	// volumes no VM mounts that were last used (per the checkout's state,
	// else created) longer than Age ago.
	Volumes bool
	// DryRun reports what would be removed and changes nothing.
	DryRun bool
	// Checkout limits pruning to one checkout slug; empty: every checkout.
	Checkout string
}

// Pruned is one removed (or, in a dry run, removable) artifact.
type Pruned struct {
	Kind   Kind   `json:"kind"`
	Name   string `json:"name"`
	Reason string `json:"reason"`
	Bytes  int64  `json:"bytes"` // space freed (for an image: its size, layers it shares may stay), -1 when unknown
}

// PruneResult lists what Prune removed and the space freed in bytes (the
// sum of the known sizes).
type PruneResult struct {
	DryRun     bool     `json:"dry_run"`
	Removed    []Pruned `json:"removed"`
	BytesFreed int64    `json:"bytes_freed"`
}

// taskGrace is how long a finished, not kept task sandbox whose spawner is
// alive is left to it (it is reading the task's results) before Prune takes
// it; also how new a runner image must be for Prune to leave it to a build
// that has not created its VM yet.
const taskGrace = 10 * time.Minute

// Prune removes what agents-sandbox made and no longer needs, found by
// labels only (nothing else on the engine is touched):
//   - task sandboxes that are not running (kept ones, and ones whose
//     spawner is gone or finished with them more than 10 minutes ago) and
//     running ones whose spawner, a process on this host, is gone;
//   - VMs (kind vm) not running and unused for longer than Age, with their
//     proxy container and internal network; with Volumes also their home
//     volumes, and home volumes no VM mounts that were last used longer
//     than Age ago (the checkout's state then forgets them);
//   - runner images no remaining VM or task uses (and not built in the last
//     10 minutes), and dangling images carrying our runner labels.
//
// A dry run lists the same without removing anything (dangling layers are
// not listed). Errors: the engine's, wrapped with the artifact's name.
func (m *Manager) Prune(ctx context.Context, o PruneOptions) (PruneResult, error) {
	if o.Age <= 0 {
		o.Age = 7 * 24 * time.Hour
	}
	res := PruneResult{DryRun: o.DryRun, Removed: []Pruned{}}
	sel := func(k Kind) map[string]string {
		l := map[string]string{LabelKind: string(k)}
		if o.Checkout != "" {
			l[LabelCheckout] = o.Checkout
		}
		return l
	}
	add := func(p Pruned) {
		res.Removed = append(res.Removed, p)
		if p.Bytes > 0 {
			res.BytesFreed += p.Bytes
		}
	}
	now := m.now()
	host, _ := os.Hostname()

	usedImages := map[string]bool{}
	usedVolumes := map[string]bool{}
	use := func(vm VM) {
		usedImages[vm.ImageID] = true
		for _, mt := range vm.Mounts {
			if mt.Type == "volume" {
				usedVolumes[mt.Source] = true
			}
		}
	}

	// Task sandboxes.
	tasks, err := m.RT.ListVMs(ctx, sel(KindTask))
	if err != nil {
		return res, fmt.Errorf("prune: list task sandboxes: %w", err)
	}
	for _, t := range tasks {
		reason := m.taskPruneReason(ctx, t, host, now)
		if reason == "" {
			use(t)
			continue
		}
		if !o.DryRun {
			if err := m.RT.RemoveVM(ctx, t.Name, true); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("prune task sandbox %q: %w", t.Name, err)
			}
		}
		add(Pruned{Kind: KindTask, Name: t.Name, Reason: reason, Bytes: -1})
	}

	// VMs unused for longer than Age.
	vms, err := m.RT.ListVMs(ctx, sel(KindVM))
	if err != nil {
		return res, fmt.Errorf("prune: list VMs: %w", err)
	}
	var homes []string // home volumes of pruned VMs
	for _, vm := range vms {
		vm = m.withTimes(ctx, vm)
		last := m.lastUsed(vm)
		if vm.State == VMRunning || vm.State == VMPaused || now.Sub(last) < o.Age {
			use(vm)
			continue
		}
		if !o.DryRun {
			if err := m.RT.RemoveVM(ctx, vm.Name, true); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("prune VM %q: %w", vm.Name, err)
			}
		}
		add(Pruned{Kind: KindVM, Name: vm.Name, Reason: "unused since " + last.UTC().Format(time.RFC3339), Bytes: -1})
		extras, err := m.pruneVMExtras(ctx, vm, o.DryRun)
		for _, e := range extras {
			add(e)
		}
		if err != nil {
			return res, err
		}
		for _, mt := range vm.Mounts {
			if mt.Type == "volume" && mt.Target == HomeDir {
				homes = append(homes, mt.Source)
			}
		}
	}

	// Home volumes: those of the pruned VMs, and others no VM mounts that
	// were unused for longer than Age.
	if o.Volumes {
		of := map[string]bool{}
		for _, h := range homes {
			of[h] = true
		}
		vols, err := m.RT.ListVolumes(ctx, sel(KindHome))
		if err != nil {
			return res, fmt.Errorf("prune: list home volumes: %w", err)
		}
		seen := map[string]bool{}
		for _, v := range vols {
			seen[v.Name] = true
		}
		// A pruned VM's home volume that lacks our labels (an older
		// layout's) still goes with it.
		for _, h := range homes {
			if !seen[h] {
				if v, err := m.RT.InspectVolume(ctx, h); err == nil {
					vols = append(vols, v)
				}
			}
		}
		sort.Slice(vols, func(i, j int) bool { return vols[i].Name < vols[j].Name })
		for _, v := range vols {
			if usedVolumes[v.Name] {
				continue
			}
			reason := ""
			if of[v.Name] {
				reason = "home volume of a pruned VM"
			} else {
				last := v.Created
				if as := m.stateFor(v.Labels); as != nil && as.HomeVolume == v.Name && as.LastUsed.After(last) {
					last = as.LastUsed
				}
				if last.IsZero() || now.Sub(last) < o.Age {
					continue
				}
				reason = "home volume unused since " + last.UTC().Format(time.RFC3339)
			}
			if !o.DryRun {
				if err := m.RT.RemoveVolume(ctx, v.Name); err != nil && !isNotFound(err) {
					return res, fmt.Errorf("prune home volume %q: %w", v.Name, err)
				}
				if err := m.forgetHomeVolume(ctx, v); err != nil {
					return res, err
				}
			}
			size := v.Size
			if iv, err := m.RT.InspectVolume(ctx, v.Name); err == nil && size < 0 {
				size = iv.Size
			}
			add(Pruned{Kind: KindHome, Name: v.Name, Reason: reason, Bytes: size})
		}
	}

	// Proxies left running by VMs that stopped themselves when idle (or
	// that are gone), and proxy images no container uses.
	pr, err := m.pruneProxies(ctx, o, sel, now)
	if err != nil {
		return res, err
	}
	for _, p := range pr {
		add(p)
	}

	// Runner images no remaining VM or task uses.
	imgs, err := m.RT.ListImages(ctx, sel(KindRunner))
	if err != nil {
		return res, fmt.Errorf("prune: list runner images: %w", err)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].ID < imgs[j].ID })
	for _, img := range imgs {
		img.Tags = realTags(img.Tags)
		if usedImages[img.ID] || len(img.Tags) == 0 || now.Sub(img.Created) < taskGrace {
			continue // untagged ones go with the dangling layers below
		}
		name := img.Tags[0]
		if !o.DryRun && !m.removeImage(ctx, img.Tags, img.ID, name) {
			continue
		}
		add(Pruned{Kind: KindRunner, Name: name, Reason: "runner image no VM uses", Bytes: img.Size})
	}

	// Dangling build layers of ours.
	if !o.DryRun {
		freed, err := m.RT.PruneBuildCache(ctx, sel(KindRunner))
		if err != nil {
			return res, fmt.Errorf("prune: dangling runner layers: %w", err)
		}
		if freed > 0 {
			add(Pruned{Kind: KindRunner, Name: "dangling build layers", Reason: "untagged layers of our builds", Bytes: freed})
		}
	}
	return res, nil
}

// taskPruneReason says why Prune removes task sandbox t, or "" to keep it.
func (m *Manager) taskPruneReason(ctx context.Context, t VM, host string, now time.Time) string {
	pid := t.Labels[labelSpawnerPID]
	local := t.Labels[labelSpawnerHost] == host
	alive := local && pidAlive(pid)
	if t.State == VMRunning || t.State == VMPaused {
		if local && !alive {
			return "task sandbox whose spawner (pid " + pid + ") is gone"
		}
		return ""
	}
	switch {
	case t.Labels[labelKeep] == "true":
		return "kept task sandbox, stopped"
	case !alive:
		return "stopped task sandbox"
	}
	// Its spawner is still at work on it (starting it, or copying its
	// results out), unless it finished with it a while ago.
	t = m.withTimes(ctx, t)
	end := t.FinishedAt
	if end.IsZero() {
		end = t.Created
	}
	if now.Sub(end) > taskGrace {
		return "stopped task sandbox"
	}
	return ""
}

// pruneVMExtras removes the proxy container and internal network of a
// pruned VM, found by its checkout and agent labels.
func (m *Manager) pruneVMExtras(ctx context.Context, vm VM, dry bool) ([]Pruned, error) {
	var out []Pruned
	slug, agent := vm.Labels[LabelCheckout], vm.Labels[LabelAgent]
	if slug == "" || agent == "" {
		return nil, nil
	}
	proxies, err := m.RT.ListVMs(ctx, map[string]string{LabelKind: string(KindProxy), LabelCheckout: slug, LabelAgent: agent})
	if err != nil {
		return out, fmt.Errorf("prune: list proxies of %q: %w", vm.Name, err)
	}
	for _, p := range proxies {
		if !dry {
			if err := m.RT.RemoveVM(ctx, p.Name, true); err != nil && !isNotFound(err) {
				return out, fmt.Errorf("prune proxy %q: %w", p.Name, err)
			}
		}
		out = append(out, Pruned{Kind: KindProxy, Name: p.Name, Reason: "proxy of pruned VM " + vm.Name, Bytes: -1})
	}
	nw, ok := m.RT.(Networker)
	if !ok {
		return out, nil
	}
	nets, err := nw.ListNetworks(ctx, map[string]string{LabelKind: string(KindNet), LabelCheckout: slug, LabelAgent: agent})
	if err != nil {
		return out, fmt.Errorf("prune: list networks of %q: %w", vm.Name, err)
	}
	for _, n := range nets {
		if !dry {
			if err := nw.RemoveNetwork(ctx, n.Name); err != nil && !isNotFound(err) {
				return out, fmt.Errorf("prune network %q: %w", n.Name, err)
			}
		}
		out = append(out, Pruned{Kind: KindNet, Name: n.Name, Reason: "network of pruned VM " + vm.Name, Bytes: -1})
	}
	return out, nil
}

// stateFor returns the agent state of the checkout and agent an artifact's
// labels name, or nil when there is none.
func (m *Manager) stateFor(labels map[string]string) *AgentState {
	slug, agent := labels[LabelCheckout], labels[LabelAgent]
	if slug == "" || agent == "" || filepath.Base(slug) != slug {
		return nil
	}
	st, err := LoadState(filepath.Join(m.Dirs.State, slug))
	if err != nil {
		return nil
	}
	return st.Agents[agent]
}

// forgetHomeVolume clears a removed home volume from its checkout's state,
// under the checkout's VM lock, so the next Create makes a new one instead
// of looking for it.
func (m *Manager) forgetHomeVolume(ctx context.Context, v Volume) error {
	slug, agent := v.Labels[LabelCheckout], v.Labels[LabelAgent]
	if slug == "" || agent == "" || filepath.Base(slug) != slug {
		return nil
	}
	dir := filepath.Join(m.Dirs.State, slug)
	if _, err := os.Stat(StateFile(dir)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lock, err := AcquireLock(ctx, LockFile(dir, "vm-"+agent))
	if err != nil {
		return fmt.Errorf("prune home volume %q: %w", v.Name, err)
	}
	defer lock.Unlock()
	st, err := LoadState(dir)
	if err != nil {
		return fmt.Errorf("prune home volume %q: %w", v.Name, err)
	}
	as := st.Agents[agent]
	if as == nil || as.HomeVolume != v.Name {
		return nil
	}
	as.HomeVolume, as.Provisioned = "", nil
	if err := SaveState(dir, st); err != nil {
		return fmt.Errorf("prune home volume %q: %w", v.Name, err)
	}
	return nil
}

// realTags drops the placeholders an engine may list for an untagged image
// ("<none>:<none>").
func realTags(tags []string) []string {
	var out []string
	for _, t := range tags {
		if !strings.HasPrefix(t, "<none>") {
			out = append(out, t)
		}
	}
	return out
}

// pidAlive reports whether a process with that pid exists on this host.
func pidAlive(s string) bool {
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// pruneProxies removes proxy containers still running for a VM that stopped
// (by itself, when idle) or for one that is gone, unless a task of that
// checkout and agent runs (Create starts a new one when it is
// needed), the internal network of a VM that is gone, and proxy images no
// container uses and not built in the last 10 minutes.
func (m *Manager) pruneProxies(ctx context.Context, o PruneOptions, sel func(Kind) map[string]string, now time.Time) ([]Pruned, error) {
	var out []Pruned
	proxies, err := m.RT.ListVMs(ctx, sel(KindProxy))
	if err != nil {
		return nil, fmt.Errorf("prune: list proxies: %w", err)
	}
	usedImages := map[string]bool{}
	for _, px := range proxies {
		vmName := strings.TrimSuffix(px.Name, "-proxy")
		vm, err := m.RT.InspectVM(ctx, vmName)
		vmGone := isNotFound(err)
		if err != nil && !vmGone {
			return nil, fmt.Errorf("prune: inspect VM %q: %w", vmName, err)
		}
		// A stopped proxy of a stopped VM is harmless and goes with the
		// VM when that is pruned; a running one is a leftover of a VM that
		// stopped itself when idle.
		if !vmGone && (vm.State == VMRunning || vm.State == VMPaused || px.State != VMRunning) {
			usedImages[px.ImageID] = true
			continue
		}
		tasks, err := m.RT.ListVMs(ctx, map[string]string{LabelKind: string(KindTask), LabelCheckout: px.Labels[LabelCheckout], LabelAgent: px.Labels[LabelAgent]})
		if err != nil {
			return nil, fmt.Errorf("prune: list tasks: %w", err)
		}
		busy := false
		for _, t := range tasks {
			busy = busy || t.State == VMRunning
		}
		if busy {
			usedImages[px.ImageID] = true
			continue
		}
		reason := "proxy of a stopped VM"
		if vmGone {
			reason = "proxy of a VM that is gone"
		}
		if !o.DryRun {
			if err := m.RT.RemoveVM(ctx, px.Name, true); err != nil && !isNotFound(err) {
				return nil, fmt.Errorf("prune proxy %q: %w", px.Name, err)
			}
		}
		out = append(out, Pruned{Kind: KindProxy, Name: px.Name, Reason: reason, Bytes: -1})
		if vmGone {
			if nw, ok := m.RT.(Networker); ok {
				netName := vmName + "-net"
				if _, err := nw.InspectNetwork(ctx, netName); err == nil {
					if !o.DryRun {
						if err := nw.RemoveNetwork(ctx, netName); err != nil && !isNotFound(err) {
							m.Log.Warn().Err(err).Str("network", netName).Msg("prune: network still in use, kept")
							continue
						}
					}
					out = append(out, Pruned{Kind: KindNet, Name: netName, Reason: "network of a VM that is gone", Bytes: -1})
				}
			}
		}
	}
	if o.Checkout != "" {
		return out, nil // proxy images are shared by every checkout
	}
	imgs, err := m.RT.ListImages(ctx, map[string]string{LabelKind: string(KindProxy), labelProxyImage: "1"})
	if err != nil {
		return nil, fmt.Errorf("prune: list proxy images: %w", err)
	}
	all, err := m.RT.ListVMs(ctx, map[string]string{LabelKind: string(KindProxy)})
	if err != nil {
		return nil, fmt.Errorf("prune: list proxies: %w", err)
	}
	for _, px := range all {
		usedImages[px.ImageID] = true
	}
	for _, img := range imgs {
		tags := realTags(img.Tags)
		if usedImages[img.ID] || now.Sub(img.Created) < taskGrace {
			continue
		}
		name := img.ID
		if len(tags) > 0 {
			name = tags[0]
		}
		if !o.DryRun && !m.removeImage(ctx, tags, img.ID, name) {
			continue
		}
		out = append(out, Pruned{Kind: KindProxy, Name: name, Reason: "proxy image no container uses", Bytes: img.Size})
	}
	return out, nil
}

// removeImage untags each of tags, then removes the image by id (removing
// by ID fails for an image with several tags). It reports false, logging
// why, when the engine keeps the image (a container still uses it).
func (m *Manager) removeImage(ctx context.Context, tags []string, id, name string) bool {
	for _, ref := range append(append([]string{}, tags...), id) {
		if err := m.RT.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
			m.Log.Warn().Err(err).Str("image", name).Msg("prune: image still in use, kept")
			return false
		}
	}
	return true
}
