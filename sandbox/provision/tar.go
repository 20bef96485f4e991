package provision

import (
	"archive/tar"
	"cmp"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"time"
)

// Tar writes p.Files as a tar archive to extract at /home/dev: entry names
// are relative to it ("./" never appears), every entry is owned by uid:gid,
// and each directory is written before what it holds. Directories that no
// source provides (parents such as ".config") get mode 0755; the others keep
// their source's mode. The order and every header field are deterministic
// (modification times are the Unix epoch). Errors: a write error, or a Plan
// with an invalid path.
func (p Plan) Tar(w io.Writer, uid, gid int) error {
	files := slices.Clone(p.Files)
	slices.SortFunc(files, func(a, b File) int { return cmp.Compare(a.Path, b.Path) })
	tw := tar.NewWriter(w)
	done := map[string]bool{}
	for _, f := range files {
		if err := checkRel(f.Path); err != nil {
			return fmt.Errorf("tar plan entry %q: path %w", f.Path, err)
		}
		var parents []string
		for d := path.Dir(f.Path); d != "." && !done[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			if err := writeHeader(tw, &tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755}, uid, gid); err != nil {
				return err
			}
			done[parents[i]] = true
		}
		h := &tar.Header{Name: f.Path, Mode: tarMode(f.Mode)}
		switch {
		case f.Dir:
			if done[f.Path] {
				continue
			}
			h.Typeflag, h.Name = tar.TypeDir, f.Path+"/"
			done[f.Path] = true
		case f.IsLink():
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.LinkTarget
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Content))
		}
		if err := writeHeader(tw, h, uid, gid); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Content); err != nil {
				return fmt.Errorf("tar write %s: %w", f.Path, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("tar close: %w", err)
	}
	return nil
}

func writeHeader(tw *tar.Writer, h *tar.Header, uid, gid int) error {
	h.Uid, h.Gid = uid, gid
	h.ModTime = time.Unix(0, 0) // fixed: the same Plan gives the same archive
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("tar header %s: %w", h.Name, err)
	}
	return nil
}

// tarMode converts permission and special bits to the tar (Unix) encoding.
func tarMode(m fs.FileMode) int64 {
	v := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// Hashes returns path → Sha256 for every file and link of p (directories
// left out): what to record in state (sandbox.AgentState.Provisioned) once
// the plan is written.
func (p Plan) Hashes() map[string]string {
	m := make(map[string]string, len(p.Files))
	for _, f := range p.Files {
		if !f.Dir {
			m[f.Path] = f.Sha256
		}
	}
	return m
}

// Lookup returns the entry at a path of p.
func (p Plan) Lookup(rel string) (File, bool) {
	i, ok := slices.BinarySearchFunc(p.Files, rel, func(f File, t string) int { return cmp.Compare(f.Path, t) })
	if !ok {
		return File{}, false
	}
	return p.Files[i], true
}

// Only returns p with its files and links limited to paths (directories are
// all kept, so their modes stay right), e.g. the write list of Diff before
// calling Tar.
func (p Plan) Only(paths []string) Plan {
	keep := make(map[string]bool, len(paths))
	for _, q := range paths {
		keep[q] = true
	}
	q := p
	q.Files = nil
	for _, f := range p.Files {
		if f.Dir || keep[f.Path] {
			q.Files = append(q.Files, f)
		}
	}
	return q
}

// Diff compares what provisioning wrote last time (previous: path → Sha256,
// as Hashes returned it and state recorded it) with p, over files and links
// (directories are never tracked, so never removed):
//   - write: in p and new or changed;
//   - remove: written last time and no longer in p as a file or link (its
//     source is gone, or a directory replaces it); paths in previous that
//     are not clean relative paths below /home/dev are ignored;
//   - unchanged: in p with the same hash.
//
// All three are sorted. Paths in neither (files the agent made) are never
// listed. p.Remove (shadowed configs) is separate: the caller removes both,
// removing before writing.
func Diff(previous map[string]string, p Plan) (write, remove, unchanged []string) {
	now := p.Hashes()
	for q, h := range now {
		if old, ok := previous[q]; ok && old == h {
			unchanged = append(unchanged, q)
		} else {
			write = append(write, q)
		}
	}
	for q := range previous {
		if _, ok := now[q]; ok {
			continue
		}
		if checkRel(q) != nil || path.Clean(q) != q {
			continue
		}
		remove = append(remove, q)
	}
	slices.Sort(write)
	slices.Sort(remove)
	slices.Sort(unchanged)
	return write, remove, unchanged
}
