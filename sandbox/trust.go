package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
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
				keys = append(keys, k+"."+tomlKey(sk))
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

// TrustedSettings lists the settings of the checkout's own configuration
// that need trust, each as `key = value` in TOML-like form (secrets show
// their source reference and hosts, never a value), sorted.
func (m *Manager) TrustedSettings(p *Project) ([]string, error) {
	file := SourcesFor(p.ID, m.Dirs, nil, nil).ProjectFile
	_, keys, err := projectTrust(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return keys, nil
	}
	layer, err := parseConfigLayer(data, file)
	if err != nil {
		return keys, nil
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		v := lookupDotted(layer, k)
		b, err := json.Marshal(v)
		if err != nil || v == nil {
			out = append(out, k)
			continue
		}
		out = append(out, k+" = "+string(b))
	}
	return out, nil
}

// lookupDotted finds a dotted key ("secrets.GH", "network.allow") in a
// parsed layer; a key segment may itself hold dots (home targets), so the
// first segment is the table and the rest is one key.
func lookupDotted(m map[string]any, key string) any {
	top, rest, ok := strings.Cut(key, ".")
	v := m[top]
	if !ok {
		return v
	}
	tbl, _ := v.(map[string]any)
	if tbl == nil {
		return nil
	}
	return tbl[strings.Trim(rest, `"`)]
}

// tomlKey quotes a key that is not a bare TOML key.
func tomlKey(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}
