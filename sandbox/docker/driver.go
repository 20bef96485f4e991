// Package docker is the Docker Engine driver of sandbox.Runtime.
//
// It talks to the engine through github.com/moby/moby/client with API version
// negotiation (Docker 20.10, API 1.41, through Docker 29), and maps engine
// errors onto the sandbox sentinels (ErrNotFound, ErrConflict, ErrInvalid,
// ErrRuntimeUnavailable). No moby type appears in an exported signature.
package docker

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/moby/moby/client"
	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

var (
	_ sandbox.Runtime   = (*Driver)(nil)
	_ sandbox.Networker = (*Driver)(nil)
)

// Name is the driver's name as RuntimeInfo.Name reports it.
const Name = "docker"

// Builder selects the engine's image builder.
type Builder string

// Builders.
const (
	// BuilderDefault lets the engine choose (the classic builder for API
	// builds on Docker 20.10).
	BuilderDefault Builder = ""
	// BuilderClassic forces the classic builder (API build version "1").
	BuilderClassic Builder = "classic"
	// BuilderBuildKit forces BuildKit (API build version "2"), which works
	// with a tar context and no session.
	BuilderBuildKit Builder = "buildkit"
)

// Options configure a Driver.
type Options struct {
	// Logger receives debug logs; the zero value logs nothing.
	Logger zerolog.Logger
	// Host overrides DOCKER_HOST ("unix:///var/run/docker.sock",
	// "tcp://host:2376", "ssh://…"); empty uses the environment.
	Host string
	// Builder selects the image builder; empty lets the engine choose.
	Builder Builder
	// PruneEngineBuildCache makes PruneBuildCache also prune the engine's
	// dangling BuildKit cache. That cache carries no labels, so this touches
	// build cache of every project on the engine; off by default.
	PruneEngineBuildCache bool
}

// Capabilities describe what the engine behind a Driver can do, as found
// when the Driver was created.
type Capabilities struct {
	APIVersion     string   // negotiated API version, "1.41"
	EngineVersion  string   // "20.10.24"
	DefaultBuilder Builder  // the engine's preferred builder (Builder-Version header)
	BuildKit       bool     // the engine can build with BuildKit
	OCIRuntimes    []string // registered OCI runtimes, sorted
	DefaultOCI     string   // the engine's default OCI runtime
	Networks       bool     // user-defined networks (sandbox.Networker)
	Remote         bool     // the engine is not on a local unix socket
}

// Driver is the Docker Engine implementation of sandbox.Runtime and
// sandbox.Networker. It is safe for concurrent use.
type Driver struct {
	cli  *client.Client
	log  zerolog.Logger
	opts Options
	caps Capabilities
}

// New connects to the engine named by opts.Host or the environment
// (DOCKER_HOST, DOCKER_CERT_PATH, DOCKER_TLS_VERIFY, DOCKER_API_VERSION),
// negotiates the API version with one Ping using ctx, and reads the engine's
// capabilities. An engine that does not answer gives an error wrapping
// sandbox.ErrRuntimeUnavailable that says how to fix it.
func New(ctx context.Context, opts Options) (*Driver, error) {
	switch opts.Builder {
	case BuilderDefault, BuilderClassic, BuilderBuildKit:
	default:
		return nil, fmt.Errorf("docker driver: builder %q: %w (want %q or %q)", opts.Builder, sandbox.ErrInvalid, BuilderClassic, BuilderBuildKit)
	}
	copts := []client.Opt{client.FromEnv}
	if opts.Host != "" {
		copts = append(copts, client.WithHost(opts.Host))
	}
	cli, err := client.New(copts...)
	if err != nil {
		return nil, fmt.Errorf("docker driver: configure client: %w: %w", sandbox.ErrRuntimeUnavailable, err)
	}
	d := &Driver{cli: cli, log: opts.Logger, opts: opts}
	ping, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	if err != nil {
		_ = cli.Close()
		return nil, d.wrap("connect to Docker engine", err)
	}
	info, err := cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		_ = cli.Close()
		return nil, d.wrap("read Docker engine info", err)
	}
	d.caps = Capabilities{
		APIVersion:    cli.ClientVersion(),
		EngineVersion: info.Info.ServerVersion,
		BuildKit:      info.Info.OSType != "windows",
		OCIRuntimes:   runtimeNames(info.Info.Runtimes),
		DefaultOCI:    info.Info.DefaultRuntime,
		Networks:      true,
		Remote:        isRemote(cli.DaemonHost()),
	}
	switch ping.BuilderVersion {
	case "2":
		d.caps.DefaultBuilder = BuilderBuildKit
	case "1":
		d.caps.DefaultBuilder = BuilderClassic
	}
	d.log.Debug().Str("host", cli.DaemonHost()).Str("api", d.caps.APIVersion).
		Str("engine", d.caps.EngineVersion).Msg("connected to Docker engine")
	return d, nil
}

// Close releases the client's idle connections.
func (d *Driver) Close() error { return d.cli.Close() }

// Capabilities returns what the engine could do when the Driver was created.
func (d *Driver) Capabilities() Capabilities {
	c := d.caps
	c.OCIRuntimes = slices.Clone(c.OCIRuntimes)
	return c
}

// Info pings the engine and describes it.
func (d *Driver) Info(ctx context.Context) (sandbox.RuntimeInfo, error) {
	if _, err := d.cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return sandbox.RuntimeInfo{}, d.wrap("ping Docker engine", err)
	}
	ver, err := d.cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return sandbox.RuntimeInfo{}, d.wrap("read Docker engine version", err)
	}
	info, err := d.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return sandbox.RuntimeInfo{}, d.wrap("read Docker engine info", err)
	}
	return sandbox.RuntimeInfo{
		Name:          Name,
		Version:       ver.Version,
		APIVersion:    d.cli.ClientVersion(),
		OS:            ver.Os,
		Arch:          ver.Arch,
		OCIRuntimes:   runtimeNames(info.Info.Runtimes),
		DefaultOCI:    info.Info.DefaultRuntime,
		StorageDriver: info.Info.Driver,
		Remote:        isRemote(d.cli.DaemonHost()),
	}, nil
}

func runtimeNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// isRemote reports whether host is anything but a local socket or pipe.
func isRemote(host string) bool {
	return !strings.HasPrefix(host, "unix://") && !strings.HasPrefix(host, "npipe://")
}

// labelFilters turns a label set into engine-side "label=k=v" filters.
func labelFilters(labels map[string]string) client.Filters {
	f := make(client.Filters)
	for k, v := range labels {
		f.Add("label", k+"="+v)
	}
	return f
}
