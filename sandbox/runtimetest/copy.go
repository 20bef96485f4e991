package runtimetest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// tarEntry is one entry of a tar stream the suite builds.
type tarEntry struct {
	name     string
	mode     int64
	uid, gid int
	body     string // a file's content; ignored for dirs and links
	dir      bool
	link     string // symlink target
}

func makeTar(t *testing.T, entries []tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag = tar.TypeDir
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// readTar reads a whole tar stream into headers and file contents by name.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string]string) {
	t.Helper()
	headers, bodies := map[string]*tar.Header{}, map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return headers, bodies
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		headers[name] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("read tar entry %s: %v", h.Name, err)
			}
			bodies[name] = string(b)
		}
	}
}

func (s *suite) testCopy(t *testing.T) {
	ctx := s.ctx(t)
	vm := s.createVM(t, sandbox.VMSpec{Name: s.name("copy")})

	// Into a created, not yet started VM.
	in := makeTar(t, []tarEntry{
		{name: "tree/", dir: true, mode: 0o750, uid: 1234, gid: 2345},
		{name: "tree/script.sh", mode: 0o751, uid: 1234, gid: 2345, body: "#!/bin/sh\necho run\n"},
		{name: "tree/secret", mode: 0o600, uid: 0, gid: 0, body: "s3cret"},
		{name: "tree/link", mode: 0o777, link: "script.sh"},
	})
	if err := s.rt.CopyTo(ctx, vm.Name, "/tmp", in); err != nil {
		t.Fatalf("CopyTo a created VM: %v", err)
	}

	// Out of the still created VM: a file, then a directory.
	rc, err := s.rt.CopyFrom(ctx, vm.Name, "/tmp/tree/script.sh")
	if err != nil {
		t.Fatalf("CopyFrom a created VM: %v", err)
	}
	headers, bodies := readTar(t, rc)
	_ = rc.Close()
	h := headers["script.sh"]
	if h == nil || bodies["script.sh"] != "#!/bin/sh\necho run\n" {
		t.Fatalf("CopyFrom file: entries %v, body %q", keys(headers), bodies["script.sh"])
	}
	if h.Mode&0o7777 != 0o751 || h.Uid != 1234 || h.Gid != 2345 {
		t.Errorf("CopyFrom file: mode %o uid %d gid %d; want 751 1234 2345", h.Mode&0o7777, h.Uid, h.Gid)
	}
	rc, err = s.rt.CopyFrom(ctx, vm.Name, "/tmp/tree")
	if err != nil {
		t.Fatalf("CopyFrom dir: %v", err)
	}
	headers, bodies = readTar(t, rc)
	_ = rc.Close()
	if d := headers["tree"]; d == nil || d.Typeflag != tar.TypeDir || d.Mode&0o7777 != 0o750 || d.Uid != 1234 {
		t.Errorf("CopyFrom dir: entry %+v; want a dir, mode 750, uid 1234", d)
	}
	if l := headers["tree/link"]; l == nil || l.Typeflag != tar.TypeSymlink || l.Linkname != "script.sh" {
		t.Errorf("CopyFrom dir: link entry %+v; want a symlink to script.sh", l)
	}
	if bodies["tree/secret"] != "s3cret" || headers["tree/secret"].Mode&0o7777 != 0o600 {
		t.Errorf("CopyFrom dir: secret %q mode %o", bodies["tree/secret"], headers["tree/secret"].Mode&0o7777)
	}

	// The running VM sees what was copied, with mode and ownership.
	if err := s.rt.StartVM(ctx, vm.Name); err != nil {
		t.Fatalf("StartVM: %v", err)
	}
	out, errOut, code := s.exec(t, vm.Name, sandbox.ExecRequest{Cmd: []string{"sh", "-c",
		"stat -c '%n %a %u %g' /tmp/tree /tmp/tree/script.sh /tmp/tree/secret; /tmp/tree/link"}})
	want := "/tmp/tree 750 1234 2345\n/tmp/tree/script.sh 751 1234 2345\n/tmp/tree/secret 600 0 0\nrun\n"
	if code != 0 || out != want {
		t.Errorf("in the VM:\n%s(exit %d, stderr %q)\nwant:\n%s", out, code, errOut, want)
	}

	// Into the running VM, replacing a file.
	if err := s.rt.CopyTo(ctx, vm.Name, "/tmp/tree", makeTar(t, []tarEntry{{name: "secret", mode: 0o640, uid: 7, gid: 8, body: "new"}})); err != nil {
		t.Fatalf("CopyTo a running VM: %v", err)
	}
	out, _, _ = s.exec(t, vm.Name, sandbox.ExecRequest{Cmd: []string{"sh", "-c", "stat -c '%a %u %g' /tmp/tree/secret; cat /tmp/tree/secret"}})
	if out != "640 7 8\nnew" {
		t.Errorf("after the second CopyTo: %q", out)
	}

	for what, err := range map[string]error{
		"CopyFrom a missing path": func() error { _, err := s.rt.CopyFrom(ctx, vm.Name, "/no/such/path"); return err }(),
		"CopyFrom a missing VM": func() error {
			_, err := s.rt.CopyFrom(ctx, s.name("no-such-vm"), "/tmp")
			return err
		}(),
		"CopyTo a missing VM":  s.rt.CopyTo(ctx, s.name("no-such-vm"), "/tmp", makeTar(t, nil)),
		"CopyTo a missing dir": s.rt.CopyTo(ctx, vm.Name, "/no/such/dir", makeTar(t, []tarEntry{{name: "f", mode: 0o644}})),
	} {
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("%s: err = %v, want ErrNotFound", what, err)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
