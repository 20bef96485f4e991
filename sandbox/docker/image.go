package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// BuildImage builds an image from req.Context (an uncompressed tar) and
// returns it as the engine reports it after the build. Every line of build
// output goes to progress: the classic builder's text as is, BuildKit's
// steps as "#n <step>", "#n <output line>", "#n DONE|CACHED|ERROR: …".
//
// The response stream is always read to its end. A failed build returns an
// error wrapping sandbox.ErrBuildFailed that quotes the failing step
// ("Step 3/7 : RUN …" or "[3/7] RUN …"), the engine's message and the last
// 20 lines of that step's output. Cancelling ctx closes the connection, which
// cancels the build on the engine.
func (d *Driver) BuildImage(ctx context.Context, req sandbox.BuildRequest, progress sandbox.ProgressFunc) (sandbox.Image, error) {
	if req.Context == nil {
		return sandbox.Image{}, fmt.Errorf("build image: %w: no build context", sandbox.ErrInvalid)
	}
	opts := client.ImageBuildOptions{
		Tags:        req.Tags,
		Dockerfile:  req.DockerfilePath,
		Labels:      req.Labels,
		NoCache:     req.NoCache,
		PullParent:  req.Pull,
		Remove:      true,
		ForceRemove: true,
	}
	if len(req.BuildArgs) > 0 {
		opts.BuildArgs = make(map[string]*string, len(req.BuildArgs))
		for k, v := range req.BuildArgs {
			opts.BuildArgs[k] = &v
		}
	}
	switch d.opts.Builder {
	case BuilderClassic:
		opts.Version = build.BuilderV1
	case BuilderBuildKit:
		opts.Version = build.BuilderBuildKit
	}
	op := fmt.Sprintf("build image %v", req.Tags)
	resp, err := d.cli.ImageBuild(ctx, req.Context, opts)
	if err != nil {
		return sandbox.Image{}, d.wrap(op, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = resp.Body.Close() })
	stream := newBuildStream(progress)
	readErr := stream.read(resp.Body)
	stop()
	_ = resp.Body.Close()
	if ctx.Err() != nil {
		return sandbox.Image{}, fmt.Errorf("%s: %w", op, ctx.Err())
	}
	if err := stream.err(); err != nil {
		return sandbox.Image{}, fmt.Errorf("%s: %w", op, err)
	}
	if readErr != nil {
		return sandbox.Image{}, d.wrap(op+": read build output", readErr)
	}
	ref := stream.imageID
	if ref == "" && len(req.Tags) > 0 {
		ref = req.Tags[0]
	}
	if ref == "" {
		return sandbox.Image{}, fmt.Errorf("%s: the engine reported no image ID", op)
	}
	img, err := d.InspectImage(ctx, ref)
	if err != nil {
		return sandbox.Image{}, fmt.Errorf("%s: %w", op, err)
	}
	return img, nil
}

// InspectImage returns the image with that reference or ID (ErrNotFound).
func (d *Driver) InspectImage(ctx context.Context, ref string) (sandbox.Image, error) {
	res, err := d.cli.ImageInspect(ctx, ref)
	if err != nil {
		return sandbox.Image{}, d.wrap(fmt.Sprintf("inspect image %q", ref), err)
	}
	img := sandbox.Image{
		ID:      res.ID,
		Tags:    res.RepoTags,
		Created: parseTime(res.Created),
		Size:    res.Size,
	}
	if res.Config != nil {
		img.Labels = res.Config.Labels
		img.User = res.Config.User
	}
	return img, nil
}

// ListImages returns the images carrying all the given labels (filtered by
// the engine). Image.User is not filled (the list API does not report it).
func (d *Driver) ListImages(ctx context.Context, labels map[string]string) ([]sandbox.Image, error) {
	res, err := d.cli.ImageList(ctx, client.ImageListOptions{Filters: labelFilters(labels)})
	if err != nil {
		return nil, d.wrap("list images", err)
	}
	out := make([]sandbox.Image, 0, len(res.Items))
	for _, s := range res.Items {
		// Older engines list a dangling image with the pseudo tag
		// "<none>:<none>", which is no reference.
		var tags []string
		for _, t := range s.RepoTags {
			if t != "<none>:<none>" {
				tags = append(tags, t)
			}
		}
		out = append(out, sandbox.Image{
			ID:      s.ID,
			Tags:    tags,
			Labels:  maps.Clone(s.Labels),
			Created: time.Unix(s.Created, 0).UTC(),
			Size:    s.Size,
		})
	}
	return out, nil
}

// RemoveImage removes an image by reference or ID, with its untagged parents
// (ErrNotFound; ErrConflict when a VM uses it). Removing one of several tags
// only untags.
func (d *Driver) RemoveImage(ctx context.Context, ref string) error {
	_, err := d.cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{PruneChildren: true})
	return d.wrap(fmt.Sprintf("remove image %q", ref), err)
}

// PruneBuildCache removes dangling (untagged) images carrying all the given
// labels and returns the bytes freed. With Options.PruneEngineBuildCache it
// also prunes the engine's dangling BuildKit cache, which carries no labels
// and so belongs to every project on the engine.
func (d *Driver) PruneBuildCache(ctx context.Context, labels map[string]string) (int64, error) {
	f := labelFilters(labels).Add("dangling", "true")
	res, err := d.cli.ImagePrune(ctx, client.ImagePruneOptions{Filters: f})
	if err != nil {
		return 0, d.wrap("prune images", err)
	}
	freed := int64(res.Report.SpaceReclaimed)
	if d.opts.PruneEngineBuildCache {
		bc, err := d.cli.BuildCachePrune(ctx, client.BuildCachePruneOptions{})
		switch {
		case err == nil:
			freed += int64(bc.Report.SpaceReclaimed)
		case errors.Is(sentinel(err), sandbox.ErrNotFound):
			// The engine has no BuildKit (API route missing): nothing to prune.
		default:
			return freed, d.wrap("prune build cache", err)
		}
	}
	return freed, nil
}

// parseTime parses an engine timestamp; the zero time for "" or the engine's
// "0001-01-01T00:00:00Z".
func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() <= 1 {
		return time.Time{}
	}
	return t
}
