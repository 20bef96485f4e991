package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// InitPath is where the agents-sandbox binary is copied inside every VM. The
// VM's entrypoint is `InitPath vm-init`, and every command runs through
// `InitPath vm-exec`.
const InitPath = "/usr/local/lib/agents-sandbox/agents-sandbox"

// Workspace is where the checkout appears inside the VM.
const Workspace = "/workspace"

// HomeDir is the VM user's home, on the persistent home volume.
const HomeDir = "/home/dev"

// Manager runs the operations of agents-sandbox against one Runtime. It holds
// no per-project state: every method takes the Project it works on. It is
// safe for concurrent use; cross-process safety comes from the checkout lock.
type Manager struct {
	RT   Runtime
	Dirs Dirs
	Log  zerolog.Logger
	// InitBinary is the host path of a static linux agents-sandbox binary
	// copied into every VM at InitPath (the running executable by default).
	InitBinary string
	// Environ is the environment config layers and secret sources read
	// (os.Environ() by default).
	Environ []string
	// HostUID and HostGID are the ids the VM's dev user gets (1000 for root).
	HostUID, HostGID int
	// RunAsRoot runs VM commands as root instead of dev. It is set when the
	// host user is root: the checkout is then root's, and a dev user at uid
	// 1000 could not write to /workspace. Files the agent creates stay owned
	// by the host user either way.
	RunAsRoot bool
	// Now returns the current time (time.Now by default).
	Now func() time.Time

	// hashes caches init binary hashes (see initHash); nil: no cache.
	// A pointer, so that copies of a Manager share it.
	hashes *sync.Map
}

// NewManager returns a Manager with defaults for everything opts leaves zero.
func NewManager(rt Runtime, dirs Dirs, log zerolog.Logger) (*Manager, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	uid, gid := DevIDs(os.Getuid(), os.Getgid())
	return &Manager{RT: rt, Dirs: dirs, Log: log, InitBinary: exe, Environ: os.Environ(), HostUID: uid, HostGID: gid, RunAsRoot: os.Getuid() == 0, Now: time.Now, hashes: &sync.Map{}}, nil
}

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Project is a resolved checkout, its merged configuration and the chosen
// agent. Build one with Manager.Open.
type Project struct {
	ID      Identity          `json:"identity"`
	Config  Config            `json:"config"`
	Origins map[string]string `json:"origins,omitempty"`
	Agent   Agent             `json:"agent"`
	Names   Names             `json:"names"`
}

// OpenOptions select the project and override configuration.
type OpenOptions struct {
	// Dir is any directory inside the checkout (absolute, or relative to the
	// process's working directory).
	Dir string
	// Agent overrides the configured agent when set.
	Agent string
	// Flags are dotted config keys set on the command line or in a tool call
	// (the highest layer).
	Flags map[string]string
	// Trust accepts the checkout's own configuration of secrets, home
	// mappings, mounts and wider egress (see ErrUntrusted).
	Trust bool
	// SkipTrust resolves without checking trust, for read-only inspection
	// (identity, config show, status, list).
	SkipTrust bool
}

// Open resolves dir, loads its layered configuration and resolves the agent.
// Errors wrap ErrInvalid for bad configuration or an unknown agent.
func (m *Manager) Open(opts OpenOptions) (*Project, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("open project: %w: no checkout directory given", ErrInvalid)
	}
	id, err := Resolve(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	flags := map[string]string{}
	for k, v := range opts.Flags {
		flags[k] = v
	}
	if opts.Agent != "" {
		flags["agent"] = opts.Agent
	}
	environ := m.Environ
	if environ == nil {
		environ = os.Environ()
	}
	lc, err := LoadConfig(SourcesFor(id, m.Dirs, environ, flags))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	agent, err := ResolveAgent(lc.Config.Agent, lc.Config)
	if err != nil {
		return nil, err
	}
	p := &Project{ID: id, Config: lc.Config, Origins: lc.Origins, Agent: agent, Names: id.Names(agent.Name, m.Dirs)}
	if !opts.SkipTrust {
		if err := m.CheckTrust(p, opts.Trust); err != nil {
			return nil, err
		}
	}
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return nil, err
	}
	applyStateSecrets(p, st)
	return p, nil
}

// lockVM takes the checkout's per-agent VM lock.
func (m *Manager) lockVM(ctx context.Context, p *Project) (*Lock, error) {
	return AcquireLock(ctx, LockFile(p.Names.StateDir, "vm-"+p.Names.Agent))
}

// VMAction says what Create did to the VM.
type VMAction string

// VM actions.
const (
	VMReused    VMAction = "reused"    // it was running
	VMStarted   VMAction = "started"   // it was stopped
	VMCreatedA  VMAction = "created"   // it was missing
	VMRecreated VMAction = "recreated" // its fingerprint changed
)

// CreateOptions tune Create.
type CreateOptions struct {
	Rebuild  bool         // build the image even when its hash is unchanged
	Progress ProgressFunc // build output and steps; may be nil
	// NoAgentDaemon skips starting the agent's daemon.
	NoAgentDaemon bool
}

// CreateResult reports what Create did. Durations are in milliseconds.
type CreateResult struct {
	VM            string           `json:"vm"`
	Image         string           `json:"image"`
	ImageID       string           `json:"image_id"`
	ImageBuilt    bool             `json:"image_built"`
	HomeVolume    string           `json:"home_volume"`
	VolumeCreated bool             `json:"volume_created"`
	Action        VMAction         `json:"action"`
	User          string           `json:"user"`
	Provision     *ProvisionResult `json:"provision,omitempty"`
	Warnings      []string         `json:"warnings,omitempty"`
	TimingsMS     map[string]int64 `json:"timings_ms"`
}

type timer struct {
	m     map[string]int64
	start time.Time
}

func newTimer() *timer { return &timer{m: map[string]int64{}, start: time.Now()} }

func (t *timer) since(name string, from time.Time) {
	t.m[name] = time.Since(from).Milliseconds()
}

func (t *timer) total() map[string]int64 {
	t.m["total"] = time.Since(t.start).Milliseconds()
	return t.m
}

// Fingerprint is a hash of everything that, when changed, requires the VM to
// be recreated: image id, env, mounts, network, resources, secret names and
// hosts, OCI runtime, idle timeout and the init binary.
func fingerprint(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func sortedKV(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// workdirFor maps the caller's directory to the same place under /workspace.
func workdirFor(p *Project) string {
	if p.ID.RelDir == "" || p.ID.RelDir == "." {
		return Workspace
	}
	return path.Join(Workspace, p.ID.RelDir)
}

// isNotFound reports whether err wraps ErrNotFound.
func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
