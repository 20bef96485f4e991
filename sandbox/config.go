package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is the merged configuration of one project. Its TOML form is
// described by schemas/config.schema.json; a test keeps the two in step.
type Config struct {
	// Agent is the default agent (opencode, claude-code, codex, shell or one
	// defined under [agents]).
	Agent string `toml:"agent" json:"agent"`
	// Runtime names the runtime driver ("docker").
	Runtime string `toml:"runtime" json:"runtime"`
	// OCIRuntime is an optional OCI runtime registered with the engine
	// ("runsc", "kata-runtime"); empty uses the engine's default.
	OCIRuntime string `toml:"oci_runtime" json:"oci_runtime,omitempty"`
	// IdleTimeout stops a VM with no client attached and no exec running for
	// this long. A string such as "30m"; "0" disables it.
	IdleTimeout Duration `toml:"idle_timeout" json:"idle_timeout"`

	Image     ImageConfig             `toml:"image" json:"image"`
	Resources Resources               `toml:"resources" json:"resources"`
	Network   NetworkConfig           `toml:"network" json:"network"`
	Env       map[string]string       `toml:"env" json:"env,omitempty"`
	Secrets   map[string]SecretConfig `toml:"secrets" json:"secrets,omitempty"`
	Home      map[string]HomeMapping  `toml:"home" json:"home,omitempty"`
	Mounts    []Mount                 `toml:"mounts" json:"mounts,omitempty"`
	Agents    map[string]AgentProfile `toml:"agents" json:"agents,omitempty"`
}

// ImageConfig configures the runner image.
type ImageConfig struct {
	// Base is the base image of the embedded default Dockerfile.
	Base string `toml:"base" json:"base"`
	// CACertificates are PEM files (host paths) added to the image's trust
	// store, for users behind TLS-inspecting proxies. A relative path in a
	// config file is resolved against that file's directory at load time;
	// "~/…" is left for the consumer.
	CACertificates []string `toml:"ca_certificates" json:"ca_certificates,omitempty"`
}

// Resources are the VM's limits. Zero means no limit.
type Resources struct {
	CPUs   float64 `toml:"cpus" json:"cpus,omitempty"`     // number of CPUs, fractional allowed
	Memory string  `toml:"memory" json:"memory,omitempty"` // bytes with unit suffix: "4g", "512m"
	Pids   int64   `toml:"pids" json:"pids,omitempty"`     // maximum number of processes
}

// NetworkMode says how the VM reaches the network.
type NetworkMode string

// Network modes.
const (
	NetworkProxy NetworkMode = "proxy" // all egress through the secret proxy
	NetworkOpen  NetworkMode = "open"  // direct egress too
	NetworkNone  NetworkMode = "none"  // no network at all
)

// NetworkConfig is the egress policy.
type NetworkConfig struct {
	Mode  NetworkMode `toml:"mode" json:"mode"`
	Allow []string    `toml:"allow" json:"allow,omitempty"` // host, .suffix or CIDR
	Deny  []string    `toml:"deny" json:"deny,omitempty"`
}

// SecretConfig says where a secret's value comes from and where it may go.
type SecretConfig struct {
	From                  string   `toml:"from" json:"from"`   // env:NAME, file:PATH, command:CMD
	Hosts                 []string `toml:"hosts" json:"hosts"` // host, .suffix or CIDR
	Body                  bool     `toml:"body" json:"body,omitempty"`
	AllowAnyHostDangerous bool     `toml:"allow_any_host_dangerous" json:"allow_any_host_dangerous,omitempty"`
}

// HomeMapping copies a host file or directory to a path under /home/dev.
// In TOML it is either a string (the source) or a table.
type HomeMapping struct {
	// Source: empty = the same path under the host's home, "~/…", absolute,
	// or relative to the config file declaring it (resolved at load time).
	Source   string `toml:"source" json:"source,omitempty"`
	Optional bool   `toml:"optional" json:"optional,omitempty"`
	Hook     string `toml:"hook" json:"hook,omitempty"` // "" or "startup"
	Root     bool   `toml:"root" json:"root,omitempty"` // run the hook as root
}

// Mount is an extra bind mount into the VM. A relative Source in a config
// file is resolved against that file's directory at load time; "~/…" is left
// for the consumer.
type Mount struct {
	Source   string `toml:"source" json:"source"`
	Target   string `toml:"target" json:"target"`
	ReadOnly bool   `toml:"read_only" json:"read_only,omitempty"`
}

// AgentProfile describes an agent as data. Built-in profiles exist for
// opencode, claude-code, codex and shell; [agents.NAME] defines more or
// overrides fields of a built-in one.
type AgentProfile struct {
	Install   string   `toml:"install" json:"install,omitempty"`       // shell run as root at image build
	NeedsNode bool     `toml:"needs_node" json:"needs_node,omitempty"` // install Node.js in the image
	Serve     []string `toml:"serve" json:"serve,omitempty"`           // optional daemon command
	Health    []string `toml:"health" json:"health,omitempty"`         // daemon health check command
	Attach    []string `toml:"attach" json:"attach,omitempty"`         // interactive command; args appended
	Headless  []string `toml:"headless" json:"headless,omitempty"`     // one prompt in, output out; args appended
	Config    string   `toml:"config" json:"config,omitempty"`         // config file it reads, relative to /home/dev
	Snippets  []string `toml:"snippets" json:"snippets,omitempty"`     // snippet glob patterns
}

// Duration is a time.Duration written as a string ("30m", "1h30m"). A bare
// number is rejected: TOML integers would otherwise mean nanoseconds.
type Duration struct{ time.Duration }

// UnmarshalTOML implements toml.Unmarshaler.
func (d *Duration) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("must be a duration string such as \"30m\" or \"1h\", not the %T %v", v, v)
	}
	return d.UnmarshalText([]byte(s))
}

// UnmarshalText parses a Go duration string ("90s", "30m", "1h30m"); "0" is
// zero. Errors: no unit ("30"), not a duration, or negative.
func (d *Duration) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "0" {
		d.Duration = 0
		return nil
	}
	if strings.HasPrefix(s, "-") {
		return fmt.Errorf("must not be negative: %q", s)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("must be a duration string with a unit such as \"30m\" or \"1h\", not %q", s)
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalTOML lets a home mapping be a bare string (its source).
func (h *HomeMapping) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case string:
		*h = HomeMapping{Source: x}
		return nil
	case map[string]any:
		for k, val := range x {
			switch k {
			case "source":
				s, ok := val.(string)
				if !ok {
					return fmt.Errorf("source must be a string")
				}
				h.Source = s
			case "optional", "root":
				b, ok := val.(bool)
				if !ok {
					return fmt.Errorf("%s must be true or false", k)
				}
				if k == "optional" {
					h.Optional = b
				} else {
					h.Root = b
				}
			case "hook":
				s, ok := val.(string)
				if !ok || (s != "" && s != "startup") {
					return fmt.Errorf("hook must be \"startup\"")
				}
				h.Hook = s
			default:
				return fmt.Errorf("unknown key %q (known: source, optional, hook, root)", k)
			}
		}
		return nil
	}
	return fmt.Errorf("must be a source path string or a table {source, optional, hook, root}")
}

// DefaultConfig returns the built-in defaults, the lowest layer.
func DefaultConfig() Config {
	return Config{
		Agent:       "opencode",
		Runtime:     "docker",
		IdleTimeout: Duration{30 * time.Minute},
		Image:       ImageConfig{Base: "debian:bookworm-slim"},
		Resources:   Resources{Pids: 4096},
		Network:     NetworkConfig{Mode: NetworkProxy},
	}
}

// Layer names, lowest first.
const (
	LayerDefault = "default"
	LayerUser    = "user"
	LayerRepo    = "repo"
	LayerProject = "project"
	LayerEnv     = "env"
	LayerFlag    = "flag"
)

// ConfigError is a configuration problem tied to a file (or env var / flag).
type ConfigError struct {
	// Source is a file path, "environment variable AGENTS_SANDBOX_X",
	// "flag for key" or "built-in defaults".
	Source string
	Line   int    // 1-based, 0 when unknown
	Column int    // 1-based, 0 when unknown
	Key    string // dotted TOML key ("network.mode", `home.".config/gh"`), when known
	Msg    string
}

// Error formats the problem as `source[:line[:column]]: key "k": message`.
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.Source)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Key != "" {
		fmt.Fprintf(&b, "key %q: ", e.Key)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ConfigSources says where each layer comes from. Empty paths are skipped.
type ConfigSources struct {
	UserFile    string            // $XDG_CONFIG_HOME/agents-sandbox/config.toml
	RepoFile    string            // $XDG_CONFIG_HOME/agents-sandbox/<repo-slug>/config.toml
	ProjectFile string            // <project>/.agents-sandbox/config.toml
	Environ     []string          // KEY=VALUE; AGENTS_SANDBOX_* entries are read
	Flags       map[string]string // dotted key → value, as given on the command line
}

// SourcesFor returns the standard layer sources of a project.
func SourcesFor(id Identity, dirs Dirs, environ []string, flags map[string]string) ConfigSources {
	return ConfigSources{
		UserFile:    filepath.Join(dirs.Config, "config.toml"),
		RepoFile:    filepath.Join(dirs.Config, id.RepoSlug, "config.toml"),
		ProjectFile: filepath.Join(id.ProjectDir, ".agents-sandbox", "config.toml"),
		Environ:     environ,
		Flags:       flags,
	}
}

// LoadedConfig is the merged configuration and where each key came from.
type LoadedConfig struct {
	Config Config
	// Origins maps a dotted key ("resources.cpus", "secrets.GH.hosts") to the
	// layer that set it: default, user, repo, project, env or flag. Keys
	// are written as in TOML: a part that is not a bare key is quoted
	// (`home.".config/gh".source`). A whole array is one key ("mounts").
	Origins map[string]string
	// Files are the config files that existed and were read, lowest first.
	Files []string
}

// LoadConfig reads and merges every layer, lowest first: built-in defaults <
// user file < per-repo file < project file < AGENTS_SANDBOX_* environment <
// flags. Tables merge key by key; arrays and scalars from a higher layer
// replace lower ones. A missing file is skipped. Relative paths in a file
// (home sources, mount sources, CA certificates) are resolved against the
// file's directory. Errors are *ConfigError: unknown keys (file and key),
// syntax errors (file, line, column), wrong types (file, key, line), bad
// durations, unknown AGENTS_SANDBOX_* variables, and values Validate rejects
// (naming the layer that set the key).
func LoadConfig(src ConfigSources) (LoadedConfig, error) {
	merged := map[string]any{}
	origins := map[string]string{}
	def, err := toMap(DefaultConfig())
	if err != nil {
		return LoadedConfig{}, err
	}
	mergeInto(merged, def, nil, LayerDefault, origins)
	layerSource := map[string]string{LayerDefault: "built-in defaults"}

	var files []string
	for _, l := range []struct{ name, path string }{
		{LayerUser, src.UserFile}, {LayerRepo, src.RepoFile}, {LayerProject, src.ProjectFile},
	} {
		if l.path == "" {
			continue
		}
		m, err := readConfigFile(l.path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return LoadedConfig{}, err
		}
		files = append(files, l.path)
		layerSource[l.name] = l.path
		mergeInto(merged, m, nil, l.name, origins)
	}

	env, err := envLayer(src.Environ)
	if err != nil {
		return LoadedConfig{}, err
	}
	mergeInto(merged, env, nil, LayerEnv, origins)
	flags, err := flagLayer(src.Flags)
	if err != nil {
		return LoadedConfig{}, err
	}
	mergeInto(merged, flags, nil, LayerFlag, origins)

	cfg, err := fromMap(merged, "merged configuration")
	if err != nil {
		return LoadedConfig{}, err
	}
	if err := cfg.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) && ce.Key != "" {
			// Name the layer that set the offending key.
			switch layer := originOf(origins, ce.Key); layer {
			case LayerEnv:
				ce.Source = "environment variable " + EnvVarName(ce.Key)
			case LayerFlag:
				ce.Source = "flag for " + ce.Key
			case "":
			default:
				ce.Source = layerSource[layer]
			}
		}
		return LoadedConfig{}, err
	}
	return LoadedConfig{Config: cfg, Origins: origins, Files: files}, nil
}

// originOf returns the highest layer that set key, a table above it or a key
// below it; failing that, the highest layer that set anything in key's
// table (a missing secrets.X.from is blamed on whoever declared secrets.X).
// "" when none did. "mounts[2].target" is looked up as "mounts".
func originOf(origins map[string]string, key string) string {
	if i := strings.IndexByte(key, '['); i >= 0 {
		key = key[:i]
	}
	rank := map[string]int{LayerDefault: 1, LayerUser: 2, LayerRepo: 3, LayerProject: 4, LayerEnv: 5, LayerFlag: 6}
	for key != "" {
		best := ""
		for k, layer := range origins {
			if k == key || strings.HasPrefix(k, key+".") || strings.HasPrefix(key, k+".") {
				if rank[layer] > rank[best] {
					best = layer
				}
			}
		}
		if best != "" {
			return best
		}
		key = parentKey(key)
	}
	return ""
}

// parentKey drops the last part of a dotted TOML key, minding quoted parts:
// `home.".config/gh".source` → `home.".config/gh"`; "agent" → "".
func parentKey(key string) string {
	last, quoted := -1, false
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '.':
			last = i
		}
	}
	if last < 0 {
		return ""
	}
	return key[:last]
}

// readConfigFile parses one layer strictly and returns it as a map with home
// mapping sources made absolute relative to the file.
func readConfigFile(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, &ConfigError{Source: path, Msg: err.Error()}
	}
	return parseConfigLayer(data, path)
}

// parseConfigLayer parses one config file's content strictly (source names it
// in errors) and returns it as a map, with relative paths made absolute
// against the directory of source.
func parseConfigLayer(data []byte, source string) (map[string]any, error) {
	// Syntax first, into a plain map: these errors have a line and column.
	var m map[string]any
	if _, err := toml.Decode(string(data), &m); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &ConfigError{Source: source, Line: pe.Position.Line, Column: pe.Position.Col, Msg: pe.Message}
		}
		return nil, &ConfigError{Source: source, Msg: err.Error()}
	}
	// Then the types, into the struct.
	var probe Config
	md, err := toml.Decode(string(data), &probe)
	if err != nil {
		return nil, decodeError(source, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, &ConfigError{Source: source, Key: keys[0], Msg: "unknown key" + didYouMean(keys[0]) + " (the keys are in the README's Configuration section and schemas/config.schema.json; check its spelling and table)" + moreKeys(keys)}
	}
	if err := checkKeyCase(md); err != nil {
		return nil, &ConfigError{Source: source, Key: err.Error(), Msg: "keys are lower-case snake_case; check its spelling"}
	}
	base := source
	if abs, err := filepath.Abs(source); err == nil {
		base = abs
	}
	resolvePaths(m, filepath.Dir(base))
	return m, nil
}

// resolvePaths makes the relative paths of one layer absolute against base:
// home sources, mount sources and CA certificate files.
func resolvePaths(m map[string]any, base string) {
	if home, ok := m["home"].(map[string]any); ok {
		for k, v := range home {
			switch x := v.(type) {
			case string:
				home[k] = resolveRel(x, base)
			case map[string]any:
				if s, ok := x["source"].(string); ok {
					x["source"] = resolveRel(s, base)
				}
			}
		}
	}
	var mounts []map[string]any
	switch x := m["mounts"].(type) {
	case []map[string]any: // [[mounts]] tables
		mounts = x
	case []any: // mounts = [{…}, …]
		for _, e := range x {
			if mt, ok := e.(map[string]any); ok {
				mounts = append(mounts, mt)
			}
		}
	}
	for _, mt := range mounts {
		if s, ok := mt["source"].(string); ok {
			mt["source"] = resolveRel(s, base)
		}
	}
	if img, ok := m["image"].(map[string]any); ok {
		if certs, ok := img["ca_certificates"].([]any); ok {
			for i, c := range certs {
				if s, ok := c.(string); ok {
					certs[i] = resolveRel(s, base)
				}
			}
		}
	}
}

// decodeError turns a BurntSushi/toml decode (type) error into a ConfigError
// naming the key, and the line when the library reports it.
func decodeError(source string, err error) *ConfigError {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		return &ConfigError{Source: source, Line: pe.Position.Line, Column: pe.Position.Col, Key: pe.LastKey, Msg: pe.Message}
	}
	// Type mismatches read: toml: line N (last key "a.b"): message
	ce := &ConfigError{Source: source, Msg: err.Error()}
	if m := decodeErrRe.FindStringSubmatch(err.Error()); m != nil {
		ce.Line, _ = strconv.Atoi(m[1])
		if k, uerr := strconv.Unquote(m[2]); uerr == nil {
			ce.Key = k
		}
		ce.Msg = m[3]
	}
	return ce
}

var decodeErrRe = regexp.MustCompile(`(?s)^toml: (?:line (\d+) )?\(last key ("(?:[^"\\]|\\.)*")\): (.*)$`)

func moreKeys(keys []string) string {
	if len(keys) < 2 {
		return ""
	}
	return fmt.Sprintf("; also unknown: %s", strings.Join(keys[1:], ", "))
}

// checkKeyCase rejects keys that only matched a struct field through
// BurntSushi/toml's case-insensitive fallback ("Agent" for "agent").
func checkKeyCase(md toml.MetaData) error {
	free := map[string]bool{"env": true, "secrets": true, "home": true, "agents": true}
	for _, k := range md.Keys() {
		for i, part := range k {
			if i > 0 && free[k[i-1]] && (i == 1) {
				continue // user-chosen names (env vars, secret names, paths)
			}
			if part != strings.ToLower(part) {
				return errors.New(k.String())
			}
		}
	}
	return nil
}

// resolveRel makes a relative, non-~ source absolute against base. An empty
// source stays empty (meaning the same path under the host's home).
func resolveRel(s, base string) string {
	if s == "" || strings.HasPrefix(s, "~") || filepath.IsAbs(s) {
		return s
	}
	return filepath.Join(base, s)
}

// fromMap decodes a merged map into a Config.
func fromMap(m map[string]any, source string) (Config, error) {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(m); err != nil {
		return Config{}, &ConfigError{Source: source, Msg: err.Error()}
	}
	var cfg Config
	if _, err := toml.Decode(buf.String(), &cfg); err != nil {
		ce := decodeError(source, err)
		ce.Line, ce.Column = 0, 0 // lines of the re-encoded merge mean nothing
		return Config{}, ce
	}
	return cfg, nil
}

// toMap turns a Config into its TOML map form (zero values dropped).
func toMap(c Config) (map[string]any, error) {
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	var m map[string]any
	if _, err := toml.Decode(buf.String(), &m); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	return dropZero(m), nil
}

func dropZero(m map[string]any) map[string]any {
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			dropZero(x)
			if len(x) == 0 {
				delete(m, k)
			}
		case string:
			if x == "" {
				delete(m, k)
			}
		case int64:
			if x == 0 {
				delete(m, k)
			}
		case float64:
			if x == 0 {
				delete(m, k)
			}
		case bool:
			if !x {
				delete(m, k)
			}
		case []any:
			if len(x) == 0 {
				delete(m, k)
			}
		}
	}
	return m
}

// mergeInto merges src into dst: tables key by key, everything else replaced.
// origins records the layer of every leaf written, keyed by the TOML form of
// its dotted key (prefix is the path of dst).
func mergeInto(dst, src map[string]any, prefix toml.Key, layer string, origins map[string]string) {
	for k, v := range src {
		path := append(prefix[:len(prefix):len(prefix)], k)
		key := path.String()
		if sm, ok := v.(map[string]any); ok {
			dm, ok := dst[k].(map[string]any)
			if !ok {
				dm = map[string]any{}
				dst[k] = dm
				// A table replacing a scalar drops the scalar's origin.
				delete(origins, key)
			}
			mergeInto(dm, sm, path, layer, origins)
			continue
		}
		// A scalar or array replacing a table drops the table's leaves.
		if _, wasMap := dst[k].(map[string]any); wasMap {
			for ok := range origins {
				if strings.HasPrefix(ok, key+".") {
					delete(origins, ok)
				}
			}
		}
		dst[k] = v
		origins[key] = layer
	}
}

// keyKind is the TOML type of a key settable from the environment or a flag.
type keyKind int

const (
	kindString keyKind = iota
	kindInt
	kindFloat
	kindBool
	kindList
	kindDuration
)

// ScalarKeys are the dotted keys that AGENTS_SANDBOX_* variables and flags may
// set. The variable name is AGENTS_SANDBOX_ + the key upper-cased with "." and
// "-" as "_": AGENTS_SANDBOX_RESOURCES_CPUS sets resources.cpus. Lists are
// comma-separated.
var ScalarKeys = map[string]keyKind{
	"agent":                 kindString,
	"runtime":               kindString,
	"oci_runtime":           kindString,
	"idle_timeout":          kindDuration,
	"image.base":            kindString,
	"image.ca_certificates": kindList,
	"resources.cpus":        kindFloat,
	"resources.memory":      kindString,
	"resources.pids":        kindInt,
	"network.mode":          kindString,
	"network.allow":         kindList,
	"network.deny":          kindList,
}

// EnvVarName returns the environment variable that sets a dotted key.
func EnvVarName(key string) string {
	return "AGENTS_SANDBOX_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// envLayer reads AGENTS_SANDBOX_* variables. Variables that name no key are
// errors, except the few that configure the process itself.
func envLayer(environ []string) (map[string]any, error) {
	byVar := map[string]string{}
	for k := range ScalarKeys {
		byVar[EnvVarName(k)] = k
	}
	notConfig := map[string]bool{"AGENTS_SANDBOX_LOG_LEVEL": true, "AGENTS_SANDBOX_FIXTURE_CACHE": true, "AGENTS_SANDBOX_BIN": true}
	out := map[string]any{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "AGENTS_SANDBOX_") || notConfig[name] {
			continue
		}
		key, known := byVar[name]
		if !known {
			return nil, &ConfigError{Source: "environment variable " + name, Msg: "names no setting; unset it or use one of: " + strings.Join(envNames(), ", ")}
		}
		v, err := parseScalar(key, val)
		if err != nil {
			return nil, &ConfigError{Source: "environment variable " + name, Key: key, Msg: err.Error()}
		}
		setDotted(out, key, v)
	}
	return out, nil
}

func envNames() []string {
	var s []string
	for k := range ScalarKeys {
		s = append(s, EnvVarName(k))
	}
	sort.Strings(s)
	return s
}

func flagLayer(flags map[string]string) (map[string]any, error) {
	out := map[string]any{}
	for key, val := range flags {
		if _, ok := ScalarKeys[key]; !ok {
			keys := make([]string, 0, len(ScalarKeys))
			for k := range ScalarKeys {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			return nil, &ConfigError{Source: "flag", Key: key, Msg: "not a key a flag can set; use one of: " + strings.Join(keys, ", ")}
		}
		v, err := parseScalar(key, val)
		if err != nil {
			return nil, &ConfigError{Source: "flag for " + key, Key: key, Msg: err.Error()}
		}
		setDotted(out, key, v)
	}
	return out, nil
}

func parseScalar(key, val string) (any, error) {
	switch ScalarKeys[key] {
	case kindInt:
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("must be a whole number, got %q", val)
		}
		return n, nil
	case kindFloat:
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("must be a number, got %q", val)
		}
		return f, nil
	case kindBool:
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("must be true or false, got %q", val)
		}
		return b, nil
	case kindList:
		var l []any
		for _, p := range strings.Split(val, ",") {
			if p = strings.TrimSpace(p); p != "" {
				l = append(l, p)
			}
		}
		if l == nil {
			l = []any{}
		}
		return l, nil
	case kindDuration:
		var d Duration
		if err := d.UnmarshalText([]byte(val)); err != nil {
			return nil, err
		}
		return strings.TrimSpace(val), nil
	}
	return val, nil
}

func setDotted(m map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[p] = sub
		}
		m = sub
	}
	m[parts[len(parts)-1]] = v
}

// Validate checks values that the types alone do not constrain.
func (c Config) Validate() error {
	src := "merged configuration"
	switch c.Network.Mode {
	case NetworkProxy, NetworkOpen, NetworkNone:
	default:
		return &ConfigError{Source: src, Key: "network.mode", Msg: fmt.Sprintf("must be \"proxy\", \"open\" or \"none\", not %q", c.Network.Mode)}
	}
	if c.Resources.CPUs < 0 {
		return &ConfigError{Source: src, Key: "resources.cpus", Msg: "must not be negative"}
	}
	if c.Resources.Pids < 0 {
		return &ConfigError{Source: src, Key: "resources.pids", Msg: "must not be negative"}
	}
	if c.Resources.Memory != "" {
		if _, err := ParseBytes(c.Resources.Memory); err != nil {
			return &ConfigError{Source: src, Key: "resources.memory", Msg: err.Error()}
		}
	}
	if c.Agent == "" {
		return &ConfigError{Source: src, Key: "agent", Msg: "must name an agent"}
	}
	for _, l := range []struct {
		key  string
		list []string
	}{{"image.ca_certificates", c.Image.CACertificates}, {"network.allow", c.Network.Allow}, {"network.deny", c.Network.Deny}} {
		if slices.Contains(l.list, "") {
			return &ConfigError{Source: src, Key: l.key, Msg: "holds an empty entry"}
		}
	}
	names := make([]string, 0, len(c.Secrets))
	for n := range c.Secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := c.Secrets[n]
		key := toml.Key{"secrets", n}.String()
		if !envNameRe(n) {
			return &ConfigError{Source: src, Key: key, Msg: "a secret's name becomes an environment variable: use letters, digits and _ (e.g. GITHUB_TOKEN)"}
		}
		if s.From == "" {
			return &ConfigError{Source: src, Key: key + ".from", Msg: "is required: env:NAME, file:PATH or command:CMD"}
		}
		if p, _, _ := strings.Cut(s.From, ":"); p != "env" && p != "file" && p != "command" {
			return &ConfigError{Source: src, Key: key + ".from", Msg: fmt.Sprintf("%q must start with env:, file: or command:", s.From)}
		}
		if slices.Contains(s.Hosts, "") {
			return &ConfigError{Source: src, Key: key + ".hosts", Msg: "holds an empty entry"}
		}
		if len(s.Hosts) == 0 && !s.AllowAnyHostDangerous {
			return &ConfigError{Source: src, Key: key + ".hosts", Msg: "a secret needs the hosts that may receive it (host, .suffix or CIDR); set allow_any_host_dangerous = true only if you accept that any host may"}
		}
	}
	for _, n := range sortedKeys(c.Env) {
		if n == "" || strings.ContainsAny(n, "=\x00") {
			return &ConfigError{Source: src, Key: toml.Key{"env", n}.String(), Msg: "an environment variable name must not be empty or contain \"=\""}
		}
	}
	for _, target := range sortedKeys(c.Home) {
		if err := checkHomeTarget(target); err != nil {
			return &ConfigError{Source: src, Key: toml.Key{"home", target}.String(), Msg: err.Error()}
		}
	}
	for i, m := range c.Mounts {
		if !filepath.IsAbs(m.Target) {
			return &ConfigError{Source: src, Key: fmt.Sprintf("mounts[%d].target", i), Msg: "must be an absolute path inside the VM"}
		}
		if m.Source == "" {
			return &ConfigError{Source: src, Key: fmt.Sprintf("mounts[%d].source", i), Msg: "is required"}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkHomeTarget rejects targets that are absolute or escape /home/dev.
func checkHomeTarget(t string) error {
	if t == "" || filepath.IsAbs(t) || strings.HasPrefix(t, "~") {
		return fmt.Errorf("target must be a path relative to /home/dev, like \".config/gh\"")
	}
	for _, p := range strings.Split(filepath.ToSlash(t), "/") {
		if p == ".." {
			return fmt.Errorf("target must not contain \"..\"")
		}
	}
	return nil
}

func envNameRe(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// ParseBytes parses a size such as "512m", "4g", "1.5GiB", "100kb" or
// "1048576" into bytes. Units are binary (k = 1024) and case-insensitive;
// "b", "kb" and "kib" mean the same. Errors: not a non-negative number with
// an optional unit, or more than math.MaxInt64 bytes.
func ParseBytes(s string) (int64, error) {
	m := bytesRe.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size; use a number with k, m, g or t, like \"4g\"", s)
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size: %w", s, err)
	}
	switch m[2] {
	case "k":
		f *= 1 << 10
	case "m":
		f *= 1 << 20
	case "g":
		f *= 1 << 30
	case "t":
		f *= 1 << 40
	}
	if f >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(f), nil
}

var bytesRe = regexp.MustCompile(`^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:([kmgt])(?:i?b)?|b)?$`)

// didYouMean suggests the known key closest to the last part of an unknown
// dotted key, as " (did you mean X?)", or "".
func didYouMean(key string) string {
	parts := strings.Split(key, ".")
	last := strings.Trim(parts[len(parts)-1], `"`)
	best, bestD := "", 3
	for _, k := range configFieldNames(reflect.TypeOf(Config{}), nil) {
		if d := editDistance(last, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" || best == last {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// configFieldNames lists the toml names of every struct field reachable
// from t (through maps, slices and pointers).
func configFieldNames(t reflect.Type, seen map[reflect.Type]bool) []string {
	for t.Kind() == reflect.Map || t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	if seen == nil {
		seen = map[reflect.Type]bool{}
	}
	if seen[t] {
		return nil
	}
	seen[t] = true
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
		out = append(out, configFieldNames(f.Type, seen)...)
	}
	return out
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
