// Package provision computes, on the host, what provisioning puts into a VM's
// home (/home/dev): the agent's config merged from snippets in three layers,
// the other files of those layers mirrored into the agent's config directory,
// and the [home] mappings of the configuration. It only reads the host
// filesystem; syncing the resulting Plan into a VM is the caller's job (Tar
// gives the archive, Diff what changed since the last run).
//
// Paths in a Plan are relative to /home/dev and slash-separated.
package provision

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Home is the home directory of the dev user inside the VM.
const Home = "/home/dev"

// Layer names, lowest first, as StandardLayers returns them.
const (
	LayerUser    = "user"
	LayerRepo    = "repo"
	LayerProject = "project"
)

// Layer is one directory of agent snippets and files.
type Layer struct {
	Name string // "user", "repo", "project": used in warnings
	Dir  string // host directory; a missing directory is an empty layer
}

// StandardLayers returns the three layers of an agent, lowest first:
// user ($XDG_CONFIG_HOME/agents-sandbox/<agent>/), per-repo
// ($XDG_CONFIG_HOME/agents-sandbox/<repo-slug>/<agent>/) and project
// (<project>/.agents-sandbox/<agent>/). configDir is
// $XDG_CONFIG_HOME/agents-sandbox (sandbox.Dirs.Config). An empty repoSlug or
// projectDir leaves that layer out.
func StandardLayers(configDir, repoSlug, projectDir, agent string) []Layer {
	ls := []Layer{{Name: LayerUser, Dir: filepath.Join(configDir, agent)}}
	if repoSlug != "" {
		ls = append(ls, Layer{Name: LayerRepo, Dir: filepath.Join(configDir, repoSlug, agent)})
	}
	if projectDir != "" {
		ls = append(ls, Layer{Name: LayerProject, Dir: filepath.Join(projectDir, ".agents-sandbox", agent)})
	}
	return ls
}

// HomeMapping copies a host file or directory to a path under /home/dev. It
// has the fields of sandbox.HomeMapping, so one converts to the other:
// provision.HomeMapping(cfg.Home[target]).
type HomeMapping struct {
	// Source: empty = the same path under the host's home; "~" or "~/…" =
	// under the host's home; otherwise an absolute host path (the config
	// loader makes paths relative to the declaring file absolute).
	Source   string
	Optional bool   // a missing source is skipped instead of an error
	Hook     string // "" or "startup": run the file after provisioning
	Root     bool   // run the hook as root
}

// Input is everything Build reads.
type Input struct {
	// Layers are the snippet layers, lowest first (see StandardLayers).
	Layers []Layer
	// Config is the file the agent reads, relative to /home/dev,
	// slash-separated (".claude/settings.json"). Its extension picks the
	// output format. Empty: the agent has no config file, and layers are
	// ignored (with a warning if they hold files).
	Config string
	// Snippets are glob patterns (path.Match syntax) matched against the
	// names of the files directly in a layer directory ("*.json"); matching
	// regular files are merged into Config. Files in subdirectories are never
	// snippets.
	Snippets []string
	// Home are the [home] mappings, keyed by target (relative to /home/dev).
	Home map[string]HomeMapping
	// HostHome is the host user's home directory, absolute. Required when a
	// mapping's source is empty or starts with "~".
	HostHome string
}

// File is one entry to put under /home/dev.
type File struct {
	// Path is relative to /home/dev, slash-separated and clean.
	Path string `json:"path"`
	// Mode holds the permission bits plus setuid, setgid and sticky; the
	// type is given by Dir and LinkTarget.
	Mode fs.FileMode `json:"mode"`
	// Dir marks a directory; Content and LinkTarget are then empty.
	Dir bool `json:"dir,omitempty"`
	// LinkTarget, when not empty, makes the entry a symbolic link to it
	// (always relative, and inside the mapping or layer it came from).
	LinkTarget string `json:"link_target,omitempty"`
	// Content of a regular file.
	Content []byte `json:"-"`
	// Sha256 is the hex SHA-256 of Content for a file, of "symlink\x00" +
	// LinkTarget for a link (so a file never matches a link), empty for a
	// directory.
	Sha256 string `json:"sha256,omitempty"`
	// Size is len(Content) for a file, len(LinkTarget) for a link, in bytes.
	Size int64 `json:"size"`
	// Origin says where the entry came from: a host path, or
	// "merged config" for the file merged from snippets.
	Origin string `json:"origin"`
}

// IsLink reports whether f is a symbolic link.
func (f File) IsLink() bool { return f.LinkTarget != "" }

// Hook is a startup hook: a provisioned file to run after provisioning.
type Hook struct {
	Path string `json:"path"` // absolute path inside the VM ("/home/dev/bin/setup.sh")
	Root bool   `json:"root"` // run as root instead of dev
}

// Plan is what provisioning puts into /home/dev.
type Plan struct {
	// Files are sorted by Path; directories come before what they hold.
	Files []File `json:"files"`
	// Remove lists paths (relative to /home/dev, sorted) to delete from the
	// VM before writing: other config files the agent would read next to the
	// merged config. Empty when no snippet exists.
	Remove []string `json:"remove,omitempty"`
	// Hooks are the startup hooks, sorted by Path.
	Hooks []Hook `json:"hooks,omitempty"`
	// Warnings are problems that were resolved (type disagreements, links
	// out of a source, replaced files); the caller logs them.
	Warnings []Warning `json:"warnings,omitempty"`
	// Config is the path of the merged config among Files, empty when no
	// snippet exists.
	Config string `json:"config,omitempty"`
	// Snippets are the host paths merged into Config, lowest first.
	Snippets []string `json:"snippets,omitempty"`
}

// MappingError is a [home] mapping that cannot be provisioned.
type MappingError struct {
	Target string // the mapping's key
	Msg    string // what is wrong and how to fix it
	Err    error  // underlying error, if any
}

func (e *MappingError) Error() string { return fmt.Sprintf("home mapping %q: %s", e.Target, e.Msg) }

func (e *MappingError) Unwrap() error { return e.Err }

// mergedOrigin is the Origin of the merged config file.
const mergedOrigin = "merged config"

// Build computes the Plan for in.
//
// Order, later winning path by path: home mappings (by target), then each
// layer's mirrored files (lowest layer first), then the merged config. When
// snippets exist, files at the paths the agent would also read as config
// (Shadowed) are left out and listed in Remove.
//
// Errors: a bad Config path or snippet pattern; a snippet that does not
// parse (*SnippetError, naming file, line and column); unreadable files; and
// every rejected home mapping (*MappingError, all joined): absolute targets,
// targets containing "..", targets on or inside Config, missing sources
// unless optional, relative or ~user sources, a startup hook that is not an
// executable file. On error the Plan is empty, so nothing gets written.
//
// Files are read through os.Root: a symbolic link inside a layer or a
// mapped directory is never followed out of it, not even when a file is
// swapped for one while Build runs. Only a mapping's source itself (say
// ~/.gitconfig linked into a dotfiles checkout) is followed. Contents are
// held in memory; mapping large trees costs their size.
func Build(in Input) (Plan, error) {
	b := &builder{files: map[string]entry{}}
	var cfgFormat Format
	if in.Config != "" {
		if err := checkRel(in.Config); err != nil {
			return Plan{}, fmt.Errorf("provision: agent config path %q: %w", in.Config, err)
		}
		in.Config = path.Clean(in.Config)
		f, err := FormatOf(in.Config)
		if err != nil {
			return Plan{}, fmt.Errorf("provision: agent config %q: %w", in.Config, err)
		}
		cfgFormat = f
	}
	for _, p := range in.Snippets {
		if _, err := path.Match(p, ""); err != nil {
			return Plan{}, fmt.Errorf("provision: snippet pattern %q: %w", p, err)
		}
	}

	hooks, err := b.addHome(in)
	if err != nil {
		return Plan{}, err
	}

	var snippets []Snippet
	var snippetPaths []string
	var snippetMode fs.FileMode = 0o644
	for _, l := range in.Layers {
		if err := b.addLayer(l, in, &snippets, &snippetPaths, &snippetMode); err != nil {
			return Plan{}, err
		}
	}

	plan := Plan{}
	if len(snippets) > 0 {
		out, warns, err := Merge(snippets, cfgFormat)
		b.warnings = append(b.warnings, warns...)
		if err != nil {
			return Plan{}, fmt.Errorf("provision: merge %s: %w", in.Config, err)
		}
		if old, ok := b.files[in.Config]; ok {
			b.warn(old.Origin, fmt.Sprintf("not provisioned: %s is the agent's config, merged from snippets", in.Config))
		}
		b.add(newFile(in.Config, snippetMode, out, mergedOrigin))
		plan.Config = in.Config
		plan.Snippets = snippetPaths
		plan.Remove = Shadowed(in.Config)
		for _, s := range plan.Remove {
			b.drop(s, "not provisioned: the agent would read it as config next to the merged "+in.Config)
		}
	}

	for _, e := range b.files {
		plan.Files = append(plan.Files, e.File)
	}
	slices.SortFunc(plan.Files, func(a, b File) int { return cmp.Compare(a.Path, b.Path) })

	var errs []error
	for _, h := range hooks {
		rel := strings.TrimPrefix(h.Path, Home+"/")
		if e, ok := b.files[rel]; !ok || e.Dir || e.IsLink() {
			errs = append(errs, &MappingError{Target: rel, Msg: "the hook's file was replaced by a later entry (a layer file or another mapping); give the hook a path of its own"})
		}
	}
	if len(errs) > 0 {
		return Plan{}, errors.Join(errs...)
	}
	plan.Hooks = hooks
	plan.Warnings = b.warnings
	return plan, nil
}

// checkRel rejects paths that are not clean relative paths below /home/dev.
func checkRel(p string) error {
	if p == "" {
		return errors.New("is empty")
	}
	if strings.HasPrefix(p, "/") || filepath.IsAbs(p) {
		return errors.New("is absolute; use a path relative to /home/dev, like \".config/gh\"")
	}
	if strings.HasPrefix(p, "~") {
		return errors.New("starts with ~; use a path relative to /home/dev, like \".config/gh\"")
	}
	if strings.Contains(p, `\`) {
		return errors.New(`contains a backslash; use "/" between path elements`)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return errors.New("contains \"..\"; use a path below /home/dev")
		}
	}
	if path.Clean(p) == "." {
		return errors.New("names /home/dev itself; name a file or directory below it")
	}
	return nil
}

// addLayer collects the layer's snippets and mirrors its other files. A
// missing layer directory is an empty layer.
func (b *builder) addLayer(l Layer, in Input, snippets *[]Snippet, paths *[]string, mode *fs.FileMode) error {
	if l.Dir == "" {
		return nil
	}
	real, err := filepath.EvalSymlinks(l.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("provision: %s layer %q: %w", l.Name, l.Dir, err)
	}
	if fi, err := os.Stat(real); err != nil {
		return fmt.Errorf("provision: %s layer %q: %w", l.Name, l.Dir, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("provision: %s layer %q: not a directory", l.Name, l.Dir)
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return fmt.Errorf("provision: %s layer %q: %w", l.Name, l.Dir, err)
	}
	defer root.Close()
	ents, err := readDir(root, ".")
	if err != nil {
		return fmt.Errorf("provision: read %s layer %q: %w", l.Name, l.Dir, err)
	}
	if in.Config == "" {
		if len(ents) > 0 {
			b.warn(l.Dir, "the agent reads no config file, so this layer's files are not provisioned")
		}
		return nil
	}
	taken := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() || !matchAny(in.Snippets, e.Name()) {
			continue
		}
		shown := filepath.Join(l.Dir, e.Name())
		taken[e.Name()] = true
		if e.Type()&fs.ModeSymlink != 0 {
			if fi, err := root.Stat(e.Name()); err != nil || !fi.Mode().IsRegular() {
				// Stat through the root fails for a link leading out of it.
				b.warn(shown, "snippet skipped: it is a symbolic link that leads out of the layer directory, nowhere, or not to a file; links are never followed out of a layer")
				continue
			}
		}
		data, fi, err := readRegular(root, e.Name())
		if errors.Is(err, errNotRegular) {
			b.warn(shown, "skipped: not a regular file")
			continue
		}
		if err != nil {
			return fmt.Errorf("provision: read snippet %q: %w", shown, err)
		}
		*snippets = append(*snippets, Snippet{Name: shown, Data: data})
		*paths = append(*paths, shown)
		*mode = fileMode(fi.Mode())
	}
	return b.walk(root, l.Dir, path.Dir(in.Config), false, taken)
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// fileMode keeps the permission, setuid, setgid and sticky bits.
func fileMode(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// builder collects entries by path; a later entry replaces an earlier one.
type builder struct {
	files    map[string]entry
	warnings []Warning
}

type entry struct{ File }

func (b *builder) warn(source, msg string) {
	b.warnings = append(b.warnings, Warning{Source: source, Message: msg})
}

// add puts f into the plan. A file, link or directory at an ancestor of
// f.Path that is not a directory is dropped (a directory must be there); an
// entry of another type at f.Path is replaced together with what it held.
func (b *builder) add(f File) {
	for dir := path.Dir(f.Path); dir != "."; dir = path.Dir(dir) {
		if e, ok := b.files[dir]; ok && !e.Dir {
			b.warn(e.Origin, fmt.Sprintf("not provisioned at %s: %s needs a directory there", dir, f.Origin))
			delete(b.files, dir)
		}
	}
	if e, ok := b.files[f.Path]; ok && e.Dir != f.Dir {
		if e.Dir {
			b.dropUnder(f.Path, fmt.Sprintf("not provisioned: %s puts a file at %s", f.Origin, f.Path))
		}
		b.warn(e.Origin, fmt.Sprintf("not provisioned at %s: replaced by %s", f.Path, f.Origin))
	}
	b.files[f.Path] = entry{f}
}

// drop removes p and everything below it, warning for each entry removed.
func (b *builder) drop(p, why string) {
	if e, ok := b.files[p]; ok {
		b.warn(e.Origin, why)
		delete(b.files, p)
	}
	b.dropUnder(p, why)
}

func (b *builder) dropUnder(p, why string) {
	var under []string
	for q := range b.files {
		if strings.HasPrefix(q, p+"/") {
			under = append(under, q)
		}
	}
	slices.Sort(under)
	for _, q := range under {
		b.warn(b.files[q].Origin, why)
		delete(b.files, q)
	}
}
