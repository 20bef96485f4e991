package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gofrs/flock"
)

// StateVersion is the version of the state file format written by this build.
const StateVersion = 1

// State is what agents-sandbox remembers about one checkout, stored as JSON in
// <state dir>/state.json. Unknown future versions are refused, never
// overwritten.
type State struct {
	Version int `json:"version"`
	// Agents holds per-agent state, keyed by agent name.
	Agents map[string]*AgentState `json:"agents,omitempty"`
	// Secrets were set with the secret_proxy tool: references (env:, file:,
	// command:) and hosts, never values. They override configured secrets of
	// the same name.
	Secrets map[string]SecretConfig `json:"secrets,omitempty"`
	// TrustedProjectConfig is the hash of the sensitive part of the
	// checkout's .agents-sandbox/config.toml the user last trusted.
	TrustedProjectConfig string `json:"trusted_project_config,omitempty"`
	// UpdatedAt is when the file was last written (UTC).
	UpdatedAt time.Time `json:"updated_at"`

	// base is what was loaded, for the three-way merge in SaveState.
	base *stateParts
}

// stateParts are the independently merged parts of a State, each as JSON.
type stateParts struct {
	agents  map[string]string
	secrets map[string]string
	trust   string
}

func partsOf(s *State) *stateParts {
	p := &stateParts{agents: map[string]string{}, secrets: map[string]string{}, trust: s.TrustedProjectConfig}
	for k, v := range s.Agents {
		if v != nil {
			b, _ := json.Marshal(v)
			p.agents[k] = string(b)
		}
	}
	for k, v := range s.Secrets {
		b, _ := json.Marshal(v)
		p.secrets[k] = string(b)
	}
	return p
}

// merge3 returns the parts of ours where ours changed them since base, and
// the parts of disk everywhere else, so that concurrent writers of different
// agents, secrets or the trust hash never lose each other's updates.
func merge3(base, ours, disk *stateParts) *stateParts {
	out := &stateParts{agents: map[string]string{}, secrets: map[string]string{}}
	pick := func(baseM, oursM, diskM, outM map[string]string) {
		keys := map[string]bool{}
		for _, m := range []map[string]string{baseM, oursM, diskM} {
			for k := range m {
				keys[k] = true
			}
		}
		for k := range keys {
			b, bok := baseM[k]
			o, ook := oursM[k]
			if ook != bok || o != b {
				if ook {
					outM[k] = o
				}
				continue
			}
			if d, ok := diskM[k]; ok {
				outM[k] = d
			}
		}
	}
	pick(base.agents, ours.agents, disk.agents, out.agents)
	pick(base.secrets, ours.secrets, disk.secrets, out.secrets)
	out.trust = disk.trust
	if ours.trust != base.trust {
		out.trust = ours.trust
	}
	return out
}

// AgentState is the state of one agent's VM in a checkout.
type AgentState struct {
	HomeVolume  string    `json:"home_volume,omitempty"`
	VM          string    `json:"vm,omitempty"`
	ImageID     string    `json:"image_id,omitempty"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	CreatedAt   time.Time `json:"created_at,omitempty"`
	LastUsed    time.Time `json:"last_used,omitempty"`
	// Provisioned maps a path under /home/dev to the sha256 of the content
	// provisioning last wrote there.
	Provisioned map[string]string `json:"provisioned,omitempty"`
	// Placeholders maps a secret name to its per-VM placeholder.
	Placeholders map[string]string `json:"placeholders,omitempty"`
	// ProxyToken is the VM's credential for its secret proxy.
	ProxyToken string `json:"proxy_token,omitempty"`
}

// StateFile is the path of the state file inside a state dir.
func StateFile(stateDir string) string { return filepath.Join(stateDir, "state.json") }

// LoadState reads the state file in stateDir. A missing file gives an empty
// state at the current version. Errors: unreadable or corrupt file, or a
// version newer than this build understands.
func LoadState(stateDir string) (*State, error) {
	path := StateFile(stateDir)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		st := &State{Version: StateVersion, Agents: map[string]*AgentState{}}
		st.base = partsOf(st)
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state %q: %w", path, err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("read state %q: corrupt (%w); move it aside to start fresh", path, err)
	}
	if s.Version > StateVersion {
		return nil, fmt.Errorf("read state %q: version %d is newer than this agents-sandbox understands (%d); upgrade agents-sandbox", path, s.Version, StateVersion)
	}
	if s.Version == 0 {
		s.Version = StateVersion
	}
	if s.Agents == nil {
		s.Agents = map[string]*AgentState{}
	}
	s.base = partsOf(&s)
	return &s, nil
}

// Agent returns the state of agent, creating it if missing.
func (s *State) Agent(agent string) *AgentState {
	if s.Agents == nil {
		s.Agents = map[string]*AgentState{}
	}
	a := s.Agents[agent]
	if a == nil {
		a = &AgentState{}
		s.Agents[agent] = a
	}
	return a
}

// SaveState writes s to stateDir atomically: a temp file in the same
// directory, fsync, rename, fsync of the directory. A crash at any point
// leaves either the old file or the new one, never a mix.
//
// Writers of one checkout's state may overlap (Create of one agent, a
// secret set through the tools, provisioning): under the state lock,
// SaveState re-reads the file and merges three ways, per agent, per secret
// and for the trust hash, keeping what s changed since it was loaded and
// what the file holds everywhere else. s is updated to the merged result.
func SaveState(stateDir string, s *State) error {
	lock, err := AcquireLock(context.Background(), LockFile(stateDir, "state"))
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer lock.Unlock()
	if s.base != nil {
		disk, err := LoadState(stateDir)
		if err != nil {
			return err
		}
		merged := merge3(s.base, partsOf(s), disk.base)
		agents := map[string]*AgentState{}
		for k, v := range merged.agents {
			var a AgentState
			if err := json.Unmarshal([]byte(v), &a); err != nil {
				return fmt.Errorf("merge state: %w", err)
			}
			agents[k] = &a
		}
		// Keep the caller's pointers for the agents it holds.
		for k, a := range agents {
			if cur := s.Agents[k]; cur != nil {
				*cur = *a
				agents[k] = cur
			}
		}
		s.Agents = agents
		var secrets map[string]SecretConfig
		if len(merged.secrets) > 0 {
			secrets = map[string]SecretConfig{}
			for k, v := range merged.secrets {
				var sc SecretConfig
				if err := json.Unmarshal([]byte(v), &sc); err != nil {
					return fmt.Errorf("merge state: %w", err)
				}
				secrets[k] = sc
			}
		}
		s.Secrets = secrets
		s.TrustedProjectConfig = merged.trust
	}
	s.Version = StateVersion
	s.UpdatedAt = time.Now().UTC()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	if err := WriteFileAtomic(StateFile(stateDir), append(data, '\n'), 0o600); err != nil {
		return err
	}
	s.base = partsOf(s)
	return nil
}

// WriteFileAtomic writes data to path via a temp file in the same directory
// (named `.<base>.tmp-*`, never read as the file itself), fsync, rename and an
// fsync of the directory, creating parent directories (0700). perm applies
// to the new file. A crash at any point leaves either the old content or the
// new one at path; it may leave the temp file behind.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return writeFileAtomic(path, data, perm, nil)
}

// atomicChunk is how much writeFileAtomic writes between calls of its hook.
const atomicChunk = 64 << 10

// writeFileAtomic is WriteFileAtomic; after, when not nil, is called after
// each chunk written to the temp file with the number of bytes written so far
// (tests use it to stop a process mid-write).
func writeFileAtomic(path string, data []byte, perm os.FileMode, after func(written int)) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write %q: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %q: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %q: %w", path, err)
	}
	for off := 0; off < len(data); {
		end := min(off+atomicChunk, len(data))
		if _, err := f.Write(data[off:end]); err != nil {
			return fmt.Errorf("write %q: %w", path, err)
		}
		off = end
		if after != nil {
			after(off)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %q: fsync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %q: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %q: rename: %w", path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Lock is an exclusive advisory lock on a file (flock(2)). The kernel drops it
// when the holding process dies, so a killed process never leaves it held.
type Lock struct{ fl *flock.Flock }

// LockFile returns the path of the named lock in a state dir.
func LockFile(stateDir, name string) string { return filepath.Join(stateDir, name+".lock") }

// AcquireLock takes the exclusive lock at path, waiting until ctx is done.
// It polls every 50 ms. Errors: the lock file cannot be created, or ctx ended
// first (the error wraps ctx.Err()).
func AcquireLock(ctx context.Context, path string) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock %q: %w", path, err)
	}
	fl := flock.New(path)
	ok, err := fl.TryLockContext(ctx, 50*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("lock %q: %w", path, err)
	}
	if !ok {
		return nil, fmt.Errorf("lock %q: not acquired", path)
	}
	return &Lock{fl: fl}, nil
}

// TryLock takes the lock at path if it is free and reports whether it did.
func TryLock(path string) (*Lock, bool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("lock %q: %w", path, err)
	}
	fl := flock.New(path)
	ok, err := fl.TryLock()
	if err != nil {
		return nil, false, fmt.Errorf("lock %q: %w", path, err)
	}
	if !ok {
		return nil, false, nil
	}
	return &Lock{fl: fl}, true, nil
}

// Unlock releases the lock. It is safe to call more than once.
func (l *Lock) Unlock() error {
	if l == nil || l.fl == nil {
		return nil
	}
	return l.fl.Unlock()
}
