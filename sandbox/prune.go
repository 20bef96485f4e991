package sandbox

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// PruneOptions select what Prune removes.
type PruneOptions struct {
	// Age: VMs unused for longer than this are removed (default 7 days).
	Age time.Duration
	// Volumes also removes the home volumes of the VMs removed, and home
	// volumes no VM or state uses that are older than Age.
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
	Bytes  int64  `json:"bytes"` // space freed, -1 when unknown
}

// PruneResult lists what Prune removed and the space freed in bytes.
type PruneResult struct {
	DryRun     bool     `json:"dry_run"`
	Removed    []Pruned `json:"removed"`
	BytesFreed int64    `json:"bytes_freed"`
}

// Prune removes what agents-sandbox made and no longer needs, found by
// labels only (nothing else on the engine is touched): stopped task
// sandboxes and running ones whose spawner died, VMs unused for longer than
// Age (their home volumes only with Volumes), runner images no VM uses, and
// dangling build layers carrying our labels.
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

	// Task sandboxes: stopped ones, and running ones whose spawner is gone.
	tasks, err := m.RT.ListVMs(ctx, sel(KindTask))
	if err != nil {
		return res, err
	}
	for _, t := range tasks {
		reason := ""
		switch {
		case t.State != VMRunning:
			reason = "stopped task sandbox"
		case t.Labels[labelSpawnerHost] == host && !pidAlive(t.Labels[labelSpawnerPID]):
			reason = "task sandbox whose spawner (pid " + t.Labels[labelSpawnerPID] + ") is gone"
		}
		if reason == "" {
			continue
		}
		if !o.DryRun {
			if err := m.RT.RemoveVM(ctx, t.Name, true); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("prune task %q: %w", t.Name, err)
			}
		}
		add(Pruned{Kind: KindTask, Name: t.Name, Reason: reason, Bytes: -1})
	}

	// VMs unused for longer than Age.
	vms, err := m.RT.ListVMs(ctx, sel(KindVM))
	if err != nil {
		return res, err
	}
	usedImages := map[string]bool{}
	usedVolumes := map[string]bool{}
	for _, vm := range vms {
		last := m.lastUsed(vm)
		if vm.State == VMRunning || now.Sub(last) < o.Age {
			usedImages[vm.ImageID] = true
			for _, mt := range vm.Mounts {
				if mt.Type == "volume" {
					usedVolumes[mt.Source] = true
				}
			}
			continue
		}
		if !o.DryRun {
			if err := m.RT.RemoveVM(ctx, vm.Name, true); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("prune VM %q: %w", vm.Name, err)
			}
		}
		add(Pruned{Kind: KindVM, Name: vm.Name, Reason: fmt.Sprintf("unused since %s", last.UTC().Format(time.RFC3339)), Bytes: -1})
		if o.Volumes {
			for _, mt := range vm.Mounts {
				if mt.Type != "volume" || mt.Target != HomeDir {
					continue
				}
				size := int64(-1)
				if v, err := m.RT.InspectVolume(ctx, mt.Source); err == nil {
					size = v.Size
				}
				if !o.DryRun {
					if err := m.RT.RemoveVolume(ctx, mt.Source); err != nil && !isNotFound(err) {
						return res, fmt.Errorf("prune home volume %q: %w", mt.Source, err)
					}
				}
				add(Pruned{Kind: KindHome, Name: mt.Source, Reason: "home volume of pruned VM " + vm.Name, Bytes: size})
			}
		}
	}
	// Tasks still running keep their image.
	for _, t := range tasks {
		if t.State == VMRunning {
			usedImages[t.ImageID] = true
		}
	}

	// Runner images no VM uses.
	imgs, err := m.RT.ListImages(ctx, sel(KindRunner))
	if err != nil {
		return res, err
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].ID < imgs[j].ID })
	for _, img := range imgs {
		if usedImages[img.ID] {
			continue
		}
		// Keep images of VMs that exist (stopped but recent).
		name := img.ID
		if len(img.Tags) > 0 {
			name = img.Tags[0]
		}
		if !o.DryRun {
			// Untag each name first: removing by ID fails for an image
			// with several tags.
			refs := append(append([]string{}, img.Tags...), img.ID)
			kept := false
			for _, ref := range refs {
				if err := m.RT.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
					m.Log.Warn().Err(err).Str("image", name).Msg("prune: image still in use, kept")
					kept = true
					break
				}
			}
			if kept {
				continue
			}
		}
		add(Pruned{Kind: KindRunner, Name: name, Reason: "runner image no VM uses", Bytes: img.Size})
	}

	// Dangling build layers of ours.
	if !o.DryRun {
		labels := map[string]string{LabelKind: string(KindRunner)}
		if o.Checkout != "" {
			labels[LabelCheckout] = o.Checkout
		}
		freed, err := m.RT.PruneBuildCache(ctx, labels)
		if err != nil {
			return res, err
		}
		if freed > 0 {
			add(Pruned{Kind: KindRunner, Name: "dangling build layers", Reason: "untagged layers of our builds", Bytes: freed})
		}
	}
	return res, nil
}

// pidAlive reports whether a process with that pid exists on this host.
func pidAlive(s string) bool {
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
