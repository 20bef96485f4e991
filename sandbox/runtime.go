package sandbox

import (
	"context"
	"errors"
	"io"
	"time"
)

// Sentinel errors of the runtime layer. Drivers wrap them with %w; front ends
// map them to tool errors and JSON-RPC codes at the edge.
var (
	// ErrNotFound: the image, volume, VM or network does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: an object with that name already exists, or is in a state
	// that forbids the operation.
	ErrConflict = errors.New("conflict")
	// ErrRuntimeUnavailable: the engine does not answer (not installed, not
	// running, no permission on its socket).
	ErrRuntimeUnavailable = errors.New("runtime unavailable")
	// ErrBuildFailed: an image build failed; the error text quotes the step
	// and the last lines of its output.
	ErrBuildFailed = errors.New("image build failed")
	// ErrInvalid: bad input from the user (config, flags, tool arguments).
	ErrInvalid = errors.New("invalid input")
)

// VMState is the lifecycle state of a VM as the runtime reports it.
type VMState string

// VM states.
const (
	VMCreated VMState = "created"
	VMRunning VMState = "running"
	VMPaused  VMState = "paused"
	VMStopped VMState = "stopped" // exited or dead
	VMMissing VMState = "missing"
)

// RuntimeInfo describes the engine behind a Runtime.
type RuntimeInfo struct {
	Name          string   `json:"name"`           // driver name, "docker"
	Version       string   `json:"version"`        // engine version, "20.10.24"
	APIVersion    string   `json:"api_version"`    // negotiated API version, "1.41"
	OS            string   `json:"os"`             // "linux"
	Arch          string   `json:"arch"`           // "amd64"
	OCIRuntimes   []string `json:"oci_runtimes"`   // registered OCI runtimes, "runc", "runsc"
	DefaultOCI    string   `json:"default_oci"`    // the engine's default OCI runtime
	StorageDriver string   `json:"storage_driver"` // "overlay2"
	Remote        bool     `json:"remote"`         // the engine is not on this host's unix socket
}

// ProgressFunc receives human-readable progress lines (build steps, build
// output). It must not block for long; it may be nil.
type ProgressFunc func(line string)

// BuildRequest is an image build.
type BuildRequest struct {
	// Context is an uncompressed tar stream of the build context; it holds
	// the Dockerfile at DockerfilePath.
	Context        io.Reader
	DockerfilePath string            // path inside Context, "Dockerfile"
	Tags           []string          // "agents-sandbox/runner-x:opencode-latest"
	Labels         map[string]string // set on the resulting image
	BuildArgs      map[string]string
	NoCache        bool
	Pull           bool // try to pull a newer base (off: there may be no registry)
}

// Image is an image as the runtime reports it.
type Image struct {
	ID      string            `json:"id"` // "sha256:…"
	Tags    []string          `json:"tags,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Created time.Time         `json:"created"`
	Size    int64             `json:"size"`           // bytes
	User    string            `json:"user,omitempty"` // the image's configured USER
}

// Volume is a named volume.
type Volume struct {
	Name    string            `json:"name"`
	Labels  map[string]string `json:"labels,omitempty"`
	Created time.Time         `json:"created"`
	Size    int64             `json:"size"` // bytes, -1 when unknown
}

// MountSpec is a mount into a VM.
type MountSpec struct {
	Type     string `json:"type"`   // "bind", "volume" or "tmpfs"
	Source   string `json:"source"` // host path or volume name; empty for tmpfs
	Target   string `json:"target"` // absolute path in the VM
	ReadOnly bool   `json:"read_only,omitempty"`
	// NoCopy disables seeding a new volume from the image's content at Target.
	NoCopy bool `json:"no_copy,omitempty"`
}

// VMSpec is everything needed to create a VM.
type VMSpec struct {
	Name       string
	Image      string // image reference or ID
	Labels     map[string]string
	Env        []string // KEY=VALUE
	Entrypoint []string // nil: the image's
	Cmd        []string
	User       string // "dev", "1000:1000"; empty: the image's
	WorkDir    string
	Hostname   string
	Mounts     []MountSpec
	// Network is the name of a network to join; "none" for no network,
	// empty for the engine's default.
	Network string
	// NetworkAliases are extra DNS names on Network.
	NetworkAliases []string
	// Init runs the engine's init (tini) as PID 1 to reap zombies.
	Init bool
	// Security.
	CapDrop     []string // "ALL"
	CapAdd      []string
	NoNewPrivs  bool
	ReadOnlyFS  bool
	CPUs        float64 // 0: unlimited
	MemoryBytes int64   // 0: unlimited
	PidsLimit   int64   // 0: unlimited
	OCIRuntime  string  // empty: engine default
	// ExtraHosts are "name:ip" entries for /etc/hosts.
	ExtraHosts []string
	// StopTimeout is how long a stop waits before SIGKILL.
	StopTimeout time.Duration
}

// VM is a VM as the runtime reports it.
type VM struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Image      string            `json:"image"`    // the reference it was created from
	ImageID    string            `json:"image_id"` // "sha256:…"
	State      VMState           `json:"state"`
	Labels     map[string]string `json:"labels,omitempty"`
	Created    time.Time         `json:"created"`
	StartedAt  time.Time         `json:"started_at,omitempty"`
	FinishedAt time.Time         `json:"finished_at,omitempty"`
	ExitCode   int               `json:"exit_code"`
	Mounts     []MountSpec       `json:"mounts,omitempty"`
	Networks   map[string]string `json:"networks,omitempty"` // network name → IP address
	OCIRuntime string            `json:"oci_runtime,omitempty"`
}

// TermSize is a terminal size in character cells.
type TermSize struct{ Rows, Cols uint16 }

// ExecRequest is a command to run in a running VM.
type ExecRequest struct {
	Cmd     []string
	User    string
	WorkDir string
	Env     []string
	// Stdin, when set, is copied to the command; the command's stdin is
	// closed when it returns EOF.
	Stdin io.Reader
	// Stdout and Stderr receive the output; nil discards it. With TTY the
	// terminal's output all goes to Stdout.
	Stdout, Stderr io.Writer
	TTY            bool
	// Resize delivers terminal size changes (TTY only); the first value is
	// applied as soon as the exec starts.
	Resize <-chan TermSize
	// Detach starts the command and returns at once (ExitCode -1).
	Detach bool
}

// ExecResult is how an exec ended.
type ExecResult struct {
	ExitCode int // the process's exit code; 126/127 when it could not start
}

// Runtime is a VM engine driver. Every method honours ctx: cancelling it
// abandons the call (an exec's process keeps running; see the exec wrapper in
// package vminit for killing it). Errors wrap ErrNotFound, ErrConflict or
// ErrRuntimeUnavailable where those apply.
type Runtime interface {
	// Info pings the engine and describes it. ErrRuntimeUnavailable when it
	// does not answer.
	Info(ctx context.Context) (RuntimeInfo, error)

	// BuildImage builds an image, sending progress lines to progress. A
	// failed build returns an error wrapping ErrBuildFailed whose text quotes
	// the failing step and the last lines of its output.
	BuildImage(ctx context.Context, req BuildRequest, progress ProgressFunc) (Image, error)
	// InspectImage returns the image with that reference or ID (ErrNotFound).
	InspectImage(ctx context.Context, ref string) (Image, error)
	// ListImages returns images carrying all the given labels.
	ListImages(ctx context.Context, labels map[string]string) ([]Image, error)
	// RemoveImage removes an image by reference or ID (ErrNotFound,
	// ErrConflict when a VM uses it).
	RemoveImage(ctx context.Context, ref string) error
	// PruneBuildCache removes dangling build cache and untagged images that
	// carry the given labels and returns the bytes freed.
	PruneBuildCache(ctx context.Context, labels map[string]string) (int64, error)

	// CreateVolume creates a named volume (ErrConflict when it exists).
	CreateVolume(ctx context.Context, name string, labels map[string]string) (Volume, error)
	InspectVolume(ctx context.Context, name string) (Volume, error)
	ListVolumes(ctx context.Context, labels map[string]string) ([]Volume, error)
	RemoveVolume(ctx context.Context, name string) error

	// CreateVM creates (does not start) a VM (ErrConflict when the name is
	// taken; ErrInvalid for an OCI runtime the engine does not have).
	CreateVM(ctx context.Context, spec VMSpec) (VM, error)
	StartVM(ctx context.Context, name string) error
	// StopVM sends SIGTERM, then SIGKILL after timeout.
	StopVM(ctx context.Context, name string, timeout time.Duration) error
	KillVM(ctx context.Context, name string) error
	// RemoveVM removes a VM; force also removes a running one. Anonymous
	// volumes go with it; named volumes stay.
	RemoveVM(ctx context.Context, name string, force bool) error
	InspectVM(ctx context.Context, name string) (VM, error)
	// ListVMs returns VMs (running or not) carrying all the given labels.
	ListVMs(ctx context.Context, labels map[string]string) ([]VM, error)
	// WaitVM blocks until the VM is no longer running and returns its exit code.
	WaitVM(ctx context.Context, name string) (int, error)

	// Exec runs a command in a running VM and waits for it (unless Detach).
	Exec(ctx context.Context, name string, req ExecRequest) (ExecResult, error)
	// CopyTo extracts a tar stream into dir inside the VM (running or not),
	// keeping mode bits and ownership recorded in the tar headers.
	CopyTo(ctx context.Context, name, dir string, tar io.Reader) error
	// CopyFrom returns a tar stream of path inside the VM.
	CopyFrom(ctx context.Context, name, path string) (io.ReadCloser, error)
}

// NetworkSpec is a network to create.
type NetworkSpec struct {
	Name     string
	Labels   map[string]string
	Internal bool // no route out of the host
	// NoHostAccess gives the host no address on the network, so its members
	// reach each other but no service of the host (an internal network
	// alone still lets them reach whatever listens on the host's address on
	// it).
	NoHostAccess bool
}

// Network is a network as the runtime reports it.
type Network struct {
	Name     string            `json:"name"`
	ID       string            `json:"id"`
	Labels   map[string]string `json:"labels,omitempty"`
	Internal bool              `json:"internal"`
	// NoHostAccess: the host has no address on the network (NetworkSpec).
	NoHostAccess bool `json:"no_host_access,omitempty"`
}

// Networker is the optional ability to manage networks (egress isolation).
type Networker interface {
	CreateNetwork(ctx context.Context, spec NetworkSpec) (Network, error) // ErrConflict when it exists
	InspectNetwork(ctx context.Context, name string) (Network, error)     // ErrNotFound
	ListNetworks(ctx context.Context, labels map[string]string) ([]Network, error)
	RemoveNetwork(ctx context.Context, name string) error
	// ConnectNetwork attaches a VM to a network with optional DNS aliases.
	ConnectNetwork(ctx context.Context, network, vm string, aliases []string) error
}
