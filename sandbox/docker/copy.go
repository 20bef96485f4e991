package docker

import (
	"context"
	"fmt"
	"io"

	"github.com/moby/moby/client"
)

// CopyTo extracts an uncompressed tar stream into dir inside the VM, running
// or not (a created VM works too). Mode bits and the uid/gid in the tar
// headers are kept. dir must exist (ErrNotFound otherwise, as for a missing
// VM); a directory in the VM is never replaced by a file of the same name
// (ErrInvalid).
func (d *Driver) CopyTo(ctx context.Context, name, dir string, tar io.Reader) error {
	_, err := d.cli.CopyToContainer(ctx, name, client.CopyToContainerOptions{
		DestinationPath: dir,
		Content:         tar,
		// CopyUIDGID would chown everything to the VM's user; without it
		// the engine keeps the ownership recorded in the tar headers.
	})
	return d.wrap(fmt.Sprintf("copy into %q in VM %q", dir, name), err)
}

// CopyFrom returns an uncompressed tar stream of path inside the VM (running
// or not); the caller closes it. A file comes as one entry named by its base
// name, a directory as its tree under its base name. ErrNotFound for a
// missing VM or path.
func (d *Driver) CopyFrom(ctx context.Context, name, path string) (io.ReadCloser, error) {
	res, err := d.cli.CopyFromContainer(ctx, name, client.CopyFromContainerOptions{SourcePath: path})
	if err != nil {
		return nil, d.wrap(fmt.Sprintf("copy %q from VM %q", path, name), err)
	}
	return res.Content, nil
}
