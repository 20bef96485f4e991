package provision

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// addHome adds every home mapping, in target order, and returns the startup
// hooks. All rejected mappings are returned together.
func (b *builder) addHome(in Input) ([]Hook, error) {
	targets := make([]string, 0, len(in.Home))
	for t := range in.Home {
		targets = append(targets, t)
	}
	slices.Sort(targets)

	var errs []error
	var hooks []Hook
	type resolved struct {
		target, source, shown string
		fi                    fs.FileInfo
	}
	var ok []resolved
	for _, t := range targets {
		m := in.Home[t]
		src, fi, err := resolveMapping(t, m, in)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fi == nil { // optional and missing
			continue
		}
		target := path.Clean(t)
		if m.Hook == "startup" {
			if !fi.Mode().IsRegular() {
				errs = append(errs, &MappingError{Target: t, Msg: fmt.Sprintf("hook = \"startup\" needs a file, but %s is a directory; point the mapping at the script", src)})
				continue
			}
			if fi.Mode()&0o111 == 0 {
				errs = append(errs, &MappingError{Target: t, Msg: fmt.Sprintf("hook = \"startup\" runs the file directly, but %s is not executable; run chmod +x on it", src)})
				continue
			}
			hooks = append(hooks, Hook{Path: Home + "/" + target, Root: m.Root})
		}
		ok = append(ok, resolved{target: target, source: src, shown: displaySource(m, src), fi: fi})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, r := range ok {
		if r.fi.IsDir() {
			root, err := os.OpenRoot(r.source)
			if err != nil {
				return nil, &MappingError{Target: r.target, Msg: fmt.Sprintf("open %s: %v", r.source, err), Err: err}
			}
			err = b.walk(root, r.shown, r.target, true, nil)
			root.Close()
			if err != nil {
				return nil, err
			}
			continue
		}
		f, err := os.OpenFile(r.source, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, &MappingError{Target: r.target, Msg: fmt.Sprintf("read %s: %v", r.source, err), Err: err}
		}
		data, fi, err := readOpened(f)
		f.Close()
		if err != nil {
			return nil, &MappingError{Target: r.target, Msg: fmt.Sprintf("read %s: %v", r.source, err), Err: err}
		}
		b.add(newFile(r.target, fileMode(fi.Mode()), data, r.shown))
	}
	return hooks, nil
}

func displaySource(m HomeMapping, resolved string) string {
	if m.Source == "" || m.Source == resolved {
		return resolved
	}
	return m.Source
}

// resolveMapping checks a mapping's target and finds its source, with the
// source's own symlinks resolved. It returns a nil FileInfo for an optional
// mapping whose source does not exist.
func resolveMapping(target string, m HomeMapping, in Input) (string, fs.FileInfo, error) {
	if err := checkRel(target); err != nil {
		return "", nil, &MappingError{Target: target, Msg: "target " + err.Error()}
	}
	t := path.Clean(target)
	if in.Config != "" {
		cfg := path.Clean(in.Config)
		if t == cfg || strings.HasPrefix(t, cfg+"/") {
			where := "a snippet in the agent's layer directory"
			if len(in.Layers) > 0 {
				where = "a snippet in " + in.Layers[0].Dir
			}
			return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("target lands on the agent's config file %s, which provisioning merges from snippets; remove the mapping and put the settings in %s instead", cfg, where)}
		}
	}
	if m.Hook != "" && m.Hook != "startup" {
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("hook = %q is not a hook kind; use hook = \"startup\" or leave it out", m.Hook)}
	}
	src := m.Source
	switch {
	case src == "":
		if in.HostHome == "" {
			return "", nil, &MappingError{Target: target, Msg: "an empty source means the same path under the host's home, but the host's home is not known (set HOME)"}
		}
		src = filepath.Join(in.HostHome, filepath.FromSlash(t))
	case src == "~" || strings.HasPrefix(src, "~/"):
		if in.HostHome == "" {
			return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %q starts with ~, but the host's home is not known (set HOME)", m.Source)}
		}
		src = filepath.Join(in.HostHome, strings.TrimPrefix(src[1:], "/"))
	case strings.HasPrefix(src, "~"):
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %q: ~user is not supported; write the absolute path", m.Source)}
	case !filepath.IsAbs(src):
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %q is relative; relative sources are resolved against the config file declaring them when it is loaded, so write it in a config file or make it absolute", m.Source)}
	}
	src = filepath.Clean(src)
	real, err := filepath.EvalSymlinks(src)
	if errors.Is(err, fs.ErrNotExist) {
		if m.Optional {
			return "", nil, nil
		}
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %s does not exist; create it, fix the source, or mark the mapping optional = true", src), Err: err}
	}
	if err != nil {
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %s: %v", src, err), Err: err}
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %s: %v", src, err), Err: err}
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return "", nil, &MappingError{Target: target, Msg: fmt.Sprintf("source %s is neither a file nor a directory", src)}
	}
	return real, fi, nil
}

// walk adds the tree of r at dest. withRoot adds dest itself as a
// directory with the root's mode. Names in skipTop, directly in the root, are
// left out. Symbolic links are kept as links when they stay inside the root
// and are skipped with a warning otherwise; they are never followed. Entries
// that are neither files, directories nor links are skipped with a warning.
// shown is the root as the user named it, for origins.
//
// Every access goes through r (os.Root), so a file swapped for a link out of
// the root while the walk runs is refused, never read.
func (b *builder) walk(r *os.Root, shown, dest string, withRoot bool, skipTop map[string]bool) error {
	if withRoot {
		fi, err := r.Stat(".")
		if err != nil {
			return fmt.Errorf("provision: %s: %w", shown, err)
		}
		b.add(File{Path: dest, Mode: fileMode(fi.Mode()), Dir: true, Origin: shown})
	}
	return b.walkDir(r, shown, dest, ".", skipTop)
}

func (b *builder) walkDir(root *os.Root, shown, dest, rel string, skipTop map[string]bool) error {
	ents, err := readDir(root, rel)
	if err != nil {
		return fmt.Errorf("provision: read directory %s: %w", filepath.Join(shown, filepath.FromSlash(rel)), err)
	}
	for _, e := range ents {
		if rel == "." && skipTop[e.Name()] {
			continue
		}
		r := path.Join(rel, e.Name())
		origin := filepath.Join(shown, filepath.FromSlash(r))
		vm := path.Join(dest, r)
		fi, err := root.Lstat(r)
		if err != nil {
			return fmt.Errorf("provision: %s: %w", origin, err)
		}
		switch {
		case fi.IsDir():
			b.add(File{Path: vm, Mode: fileMode(fi.Mode()), Dir: true, Origin: origin})
			if err := b.walkDir(root, shown, dest, r, skipTop); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := root.Readlink(r)
			if err != nil {
				return fmt.Errorf("provision: read link %s: %w", origin, err)
			}
			if !linkInside(r, target) {
				b.warn(origin, fmt.Sprintf("skipped: symbolic link to %s leads out of %s; links are copied only when they stay inside their source", target, shown))
				continue
			}
			b.add(newLink(vm, target, origin))
		case fi.Mode().IsRegular():
			data, fi, err := readRegular(root, r)
			if errors.Is(err, errNotRegular) {
				b.warn(origin, "skipped: it stopped being a regular file while it was read")
				continue
			}
			if err != nil {
				return fmt.Errorf("provision: read %s: %w", origin, err)
			}
			b.add(newFile(vm, fileMode(fi.Mode()), data, origin))
		default:
			b.warn(origin, fmt.Sprintf("skipped: a %s is neither a file, a directory nor a symbolic link", typeName(fi.Mode())))
		}
	}
	return nil
}

func typeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file (" + m.Type().String() + ")"
}

// readDir lists a directory of root, sorted by name.
func readDir(root *os.Root, rel string) ([]fs.DirEntry, error) {
	f, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}

var errNotRegular = errors.New("not a regular file")

// readRegular reads a regular file of root (following links only while
// they stay inside root) and returns its content and the opened file's
// info. It opens without blocking, so a FIFO put in the file's place is
// reported as errNotRegular instead of hanging the read.
func readRegular(root *os.Root, rel string) ([]byte, fs.FileInfo, error) {
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	return readOpened(f)
}

func readOpened(f *os.File) ([]byte, fs.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, errNotRegular
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, nil, err
	}
	return data, fi, nil
}

// linkInside reports whether a link at rel (slash path below the source
// root) with the given target resolves, lexically, inside the root. Absolute
// targets never do: they would name host paths inside the VM.
func linkInside(rel, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || filepath.IsAbs(target) || strings.Contains(target, `\`) {
		return false
	}
	j := path.Join(path.Dir(rel), target)
	return j != ".." && !strings.HasPrefix(j, "../")
}

func newFile(p string, mode fs.FileMode, data []byte, origin string) File {
	sum := sha256.Sum256(data)
	if data == nil {
		data = []byte{}
	}
	return File{Path: p, Mode: mode, Content: data, Sha256: hex.EncodeToString(sum[:]), Size: int64(len(data)), Origin: origin}
}

func newLink(p, target, origin string) File {
	sum := sha256.Sum256([]byte("symlink\x00" + target))
	return File{Path: p, Mode: 0o777, LinkTarget: target, Sha256: hex.EncodeToString(sum[:]), Size: int64(len(target)), Origin: origin}
}
