package docker

import (
	"context"
	"fmt"
	"maps"

	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// CreateVolume creates a named local volume with the given labels. The
// engine treats create as idempotent, so the driver inspects first and
// returns ErrConflict for a name that exists; two creates racing for the same
// new name may both succeed, with one volume.
func (d *Driver) CreateVolume(ctx context.Context, name string, labels map[string]string) (sandbox.Volume, error) {
	op := fmt.Sprintf("create volume %q", name)
	if name == "" {
		return sandbox.Volume{}, fmt.Errorf("%s: %w: empty name", op, sandbox.ErrInvalid)
	}
	switch _, err := d.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{}); {
	case err == nil:
		return sandbox.Volume{}, fmt.Errorf("%s: %w: a volume with that name exists", op, sandbox.ErrConflict)
	case sentinel(err) != sandbox.ErrNotFound:
		return sandbox.Volume{}, d.wrap(op, err)
	}
	res, err := d.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Labels: labels})
	if err != nil {
		return sandbox.Volume{}, d.wrap(op, err)
	}
	return toVolume(res.Volume), nil
}

// InspectVolume returns the named volume (ErrNotFound). Size is -1.
func (d *Driver) InspectVolume(ctx context.Context, name string) (sandbox.Volume, error) {
	res, err := d.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	if err != nil {
		return sandbox.Volume{}, d.wrap(fmt.Sprintf("inspect volume %q", name), err)
	}
	return toVolume(res.Volume), nil
}

// ListVolumes returns the volumes carrying all the given labels (filtered by
// the engine).
func (d *Driver) ListVolumes(ctx context.Context, labels map[string]string) ([]sandbox.Volume, error) {
	res, err := d.cli.VolumeList(ctx, client.VolumeListOptions{Filters: labelFilters(labels)})
	if err != nil {
		return nil, d.wrap("list volumes", err)
	}
	out := make([]sandbox.Volume, 0, len(res.Items))
	for _, v := range res.Items {
		out = append(out, toVolume(v))
	}
	return out, nil
}

// RemoveVolume removes the named volume (ErrNotFound; ErrConflict while a VM
// uses it).
func (d *Driver) RemoveVolume(ctx context.Context, name string) error {
	_, err := d.cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{})
	return d.wrap(fmt.Sprintf("remove volume %q", name), err)
}

func toVolume(v volume.Volume) sandbox.Volume {
	out := sandbox.Volume{
		Name:    v.Name,
		Labels:  maps.Clone(v.Labels),
		Created: parseTime(v.CreatedAt),
		Size:    -1,
	}
	if v.UsageData != nil && v.UsageData.Size >= 0 {
		out.Size = v.UsageData.Size
	}
	return out
}
