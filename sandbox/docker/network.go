package docker

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// optInhibitIPv4 keeps the bridge itself (the host) without an IPv4 address
// on the network: sandbox.NetworkSpec.NoHostAccess.
const optInhibitIPv4 = "com.docker.network.bridge.inhibit_ipv4"

// CreateNetwork creates a bridge network (ErrConflict when one with that
// name exists; the engine itself would allow duplicates on API < 1.44).
// Internal networks have no route out of the host.
func (d *Driver) CreateNetwork(ctx context.Context, spec sandbox.NetworkSpec) (sandbox.Network, error) {
	op := fmt.Sprintf("create network %q", spec.Name)
	if spec.Name == "" {
		return sandbox.Network{}, fmt.Errorf("%s: %w: empty name", op, sandbox.ErrInvalid)
	}
	switch _, err := d.cli.NetworkInspect(ctx, spec.Name, client.NetworkInspectOptions{}); {
	case err == nil:
		return sandbox.Network{}, fmt.Errorf("%s: %w: a network with that name exists", op, sandbox.ErrConflict)
	case sentinel(err) != sandbox.ErrNotFound:
		return sandbox.Network{}, d.wrap(op, err)
	}
	var options map[string]string
	if spec.NoHostAccess {
		options = map[string]string{optInhibitIPv4: "true"}
	}
	res, err := d.cli.NetworkCreate(ctx, spec.Name, client.NetworkCreateOptions{
		Driver:   "bridge",
		Internal: spec.Internal,
		Labels:   spec.Labels,
		Options:  options,
	})
	if err != nil {
		return sandbox.Network{}, d.wrap(op, err)
	}
	return d.InspectNetwork(ctx, res.ID)
}

// InspectNetwork returns the network with that name or ID (ErrNotFound).
func (d *Driver) InspectNetwork(ctx context.Context, name string) (sandbox.Network, error) {
	res, err := d.cli.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	if err != nil {
		return sandbox.Network{}, d.wrap(fmt.Sprintf("inspect network %q", name), err)
	}
	return toNetwork(res.Network.Network), nil
}

// ListNetworks returns the networks carrying all the given labels (filtered
// by the engine).
func (d *Driver) ListNetworks(ctx context.Context, labels map[string]string) ([]sandbox.Network, error) {
	res, err := d.cli.NetworkList(ctx, client.NetworkListOptions{Filters: labelFilters(labels)})
	if err != nil {
		return nil, d.wrap("list networks", err)
	}
	out := make([]sandbox.Network, 0, len(res.Items))
	for _, n := range res.Items {
		out = append(out, toNetwork(n.Network))
	}
	return out, nil
}

// RemoveNetwork removes a network (ErrNotFound; ErrConflict while a VM is
// attached — the engine reports that as a 403, mapped here).
func (d *Driver) RemoveNetwork(ctx context.Context, name string) error {
	_, err := d.cli.NetworkRemove(ctx, name, client.NetworkRemoveOptions{})
	if err != nil && sentinel(err) == nil && isForbidden(err) {
		return fmt.Errorf("remove network %q: %w: %w", name, sandbox.ErrConflict, err)
	}
	return d.wrap(fmt.Sprintf("remove network %q", name), err)
}

// ConnectNetwork attaches a VM (running or not) to a network with extra DNS
// aliases (ErrNotFound for either; ErrConflict when a running VM is already
// attached — the engine silently accepts a repeat for a created one).
func (d *Driver) ConnectNetwork(ctx context.Context, networkName, vm string, aliases []string) error {
	op := fmt.Sprintf("connect VM %q to network %q", vm, networkName)
	_, err := d.cli.NetworkConnect(ctx, networkName, client.NetworkConnectOptions{
		Container:      vm,
		EndpointConfig: &network.EndpointSettings{Aliases: slices.Clone(aliases)},
	})
	if err != nil && sentinel(err) == nil && isForbidden(err) {
		return fmt.Errorf("%s: %w: %w", op, sandbox.ErrConflict, err)
	}
	return d.wrap(op, err)
}

func toNetwork(n network.Network) sandbox.Network {
	return sandbox.Network{
		Name:     n.Name,
		ID:       n.ID,
		Labels:   maps.Clone(n.Labels),
		Internal: n.Internal,
		// The engine keeps the options as given; it parses this one as a bool.
		NoHostAccess: n.Options[optInhibitIPv4] == "true" || n.Options[optInhibitIPv4] == "1",
	}
}
