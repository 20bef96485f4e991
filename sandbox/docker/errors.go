package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// wrap names the operation and maps an engine error onto the sandbox
// sentinels, keeping the engine's own error in the chain and in the text:
//
//	inspect VM "x": not found: Error response from daemon: No such container: x
//
// Context cancellation and deadline errors pass through unmapped.
func (d *Driver) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if s := sentinel(err); s != nil {
		if s == sandbox.ErrRuntimeUnavailable {
			return fmt.Errorf("%s: %w: %w (%s)", op, s, err, d.unavailableHint(err))
		}
		return fmt.Errorf("%s: %w: %w", op, s, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// sentinel returns the sandbox sentinel an engine error maps to, or nil.
func sentinel(err error) error {
	switch {
	case client.IsErrConnectionFailed(err), isDialError(err):
		return sandbox.ErrRuntimeUnavailable
	case cerrdefs.IsNotFound(err):
		return sandbox.ErrNotFound
	case cerrdefs.IsConflict(err), cerrdefs.IsAlreadyExists(err):
		return sandbox.ErrConflict
	case cerrdefs.IsInvalidArgument(err):
		return sandbox.ErrInvalid
	}
	return nil
}

// isDialError catches connection failures that the client does not classify
// itself (a hijacked dial, a socket that vanished between calls).
func isDialError(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) && strings.Contains(err.Error(), "dial")
}

// unavailableHint says how to make the engine answer.
func (d *Driver) unavailableHint(err error) string {
	host := d.cli.DaemonHost()
	msg := err.Error()
	switch {
	case errors.Is(err, os.ErrPermission) || strings.Contains(msg, "permission denied"):
		return fmt.Sprintf("no permission on %s: add your user to the docker group (sudo usermod -aG docker $USER, then log in again) or point DOCKER_HOST at an engine you may use", host)
	case isRemote(host):
		return fmt.Sprintf("no Docker engine answers at %s: check DOCKER_HOST and that the remote engine is up", host)
	default:
		return fmt.Sprintf("no Docker engine answers at %s: start dockerd (sudo systemctl start docker, or dockerd &) or set DOCKER_HOST to a running engine", host)
	}
}

// isForbidden reports an engine 403, which Docker uses for "network has
// active endpoints" and "endpoint already exists in network".
func isForbidden(err error) bool { return cerrdefs.IsPermissionDenied(err) }
