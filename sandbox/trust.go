package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
)

// ErrUntrusted: the checkout's own configuration asks for something that
// reaches outside the VM (secrets, host files, mounts, wider egress) and the
// user has not accepted it yet.
var ErrUntrusted = errors.New("untrusted project configuration")

// sensitiveKeys are the top-level keys and tables of the project layer that
// could carry host data into the VM or widen its egress. The project file
// lives in the checkout, which the agent can write, so these need the
// user's consent (agents-sandbox trust) before they take effect.
var sensitiveKeys = []string{"secrets", "home", "mounts", "network", "image.ca_certificates", "oci_runtime", "runtime"}

// projectTrust returns the sensitive part of the project layer as canonical
// JSON plus its hash, and the dotted keys it sets. An empty part needs no
// trust.
func projectTrust(projectFile string) (hash string, keys []string, err error) {
	data, err := os.ReadFile(projectFile)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	m, err := parseConfigLayer(data, projectFile)
	if err != nil {
		return "", nil, err
	}
	part := map[string]any{}
	for _, k := range sensitiveKeys {
		top, sub, nested := strings.Cut(k, ".")
		v, ok := m[top]
		if !ok {
			continue
		}
		if nested {
			tbl, ok := v.(map[string]any)
			if !ok {
				continue
			}
			if sv, ok := tbl[sub]; ok {
				part[k] = sv
				keys = append(keys, k)
			}
			continue
		}
		if top == "network" {
			// Narrowing egress is always fine: only allow lists and a
			// non-"none"/"proxy" mode widen it.
			tbl, _ := v.(map[string]any)
			if a, ok := tbl["allow"]; ok {
				part["network.allow"] = a
				keys = append(keys, "network.allow")
			}
			if mode, ok := tbl["mode"].(string); ok && mode == string(NetworkOpen) {
				part["network.mode"] = mode
				keys = append(keys, "network.mode")
			}
			continue
		}
		part[k] = v
		if tbl, ok := v.(map[string]any); ok {
			for sk := range tbl {
				keys = append(keys, k+"."+sk)
			}
		} else {
			keys = append(keys, k)
		}
	}
	if len(part) == 0 {
		return "", nil, nil
	}
	sort.Strings(keys)
	b, err := json.Marshal(part) // maps marshal with sorted keys
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), keys, nil
}

// CheckTrust refuses (ErrUntrusted) a checkout whose own configuration sets
// secrets, home mappings, mounts or wider egress that changed since the user
// last trusted them, unless trust is set, which records the current content
// as trusted in the checkout's state. Open calls it unless SkipTrust.
func (m *Manager) CheckTrust(p *Project, trust bool) error {
	file := SourcesFor(p.ID, m.Dirs, nil, nil).ProjectFile
	hash, keys, err := projectTrust(file)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if hash == "" {
		return nil
	}
	st, err := LoadState(p.Names.StateDir)
	if err != nil {
		return err
	}
	if st.TrustedProjectConfig == hash {
		return nil
	}
	if !trust {
		return fmt.Errorf("%s sets %s, which can carry host data into the VM or widen its egress, and it is new or changed since you last trusted it: %w; review it, then run `agents-sandbox trust` (or pass --trust, or trust: true in a tool call)",
			file, strings.Join(keys, ", "), ErrUntrusted)
	}
	st.TrustedProjectConfig = hash
	return SaveState(p.Names.StateDir, st)
}
