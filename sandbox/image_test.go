package sandbox_test

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// imageTestCert returns a fresh self-signed CA certificate as DER.
func imageTestCert(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func imagePEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func imageWriteFile(t *testing.T, path string, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // the umask does not decide
		t.Fatal(err)
	}
}

func imageAgent(t *testing.T, name string, cfg sandbox.Config) sandbox.Agent {
	t.Helper()
	a, err := sandbox.ResolveAgent(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// imageTarEntry is one entry of a build context tar, as the tests compare them.
type imageTarEntry struct {
	Name, Link string
	Type       byte
	Mode       int64
	Uid, Gid   int
	Data       string
}

func imageReadTar(t *testing.T, plan sandbox.ImagePlan) []imageTarEntry {
	t.Helper()
	var buf bytes.Buffer
	if err := plan.Tar(&buf); err != nil {
		t.Fatal(err)
	}
	var out []imageTarEntry
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, imageTarEntry{hdr.Name, hdr.Linkname, hdr.Typeflag, hdr.Mode, hdr.Uid, hdr.Gid, string(data)})
	}
	return out
}

func imageEntryNames(es []imageTarEntry) []string {
	var names []string
	for _, e := range es {
		names = append(names, e.Name)
	}
	return names
}

func TestDevIDs(t *testing.T) {
	t.Parallel()
	tests := []struct{ uid, gid, wantUID, wantGID int }{
		{1234, 5678, 1234, 5678},
		{0, 0, 1000, 1000},
		{0, 5678, 1000, 1000},
		{501, 0, 501, 1000},
		{-1, -1, 1000, 1000},
	}
	for _, tt := range tests {
		u, g := sandbox.DevIDs(tt.uid, tt.gid)
		if u != tt.wantUID || g != tt.wantGID {
			t.Errorf("DevIDs(%d, %d) = %d, %d; want %d, %d", tt.uid, tt.gid, u, g, tt.wantUID, tt.wantGID)
		}
	}
}

func TestPlanImageGenerated(t *testing.T) {
	t.Parallel()
	project := t.TempDir()
	der := imageTestCert(t, "corp root")
	imageWriteFile(t, filepath.Join(project, "certs", "corp.pem"), "junk before\n"+string(imagePEM(der))+"junk after\n", 0o644)
	derFile := filepath.Join(t.TempDir(), "Proxy CA.der")
	der2 := imageTestCert(t, "proxy")
	if err := os.WriteFile(derFile, der2, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.DefaultConfig()
	cfg.Image.CACertificates = []string{"certs/corp.pem", derFile}
	agent := imageAgent(t, "claude-code", cfg)
	plan, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: project}, cfg, agent, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Custom || plan.ContextDir != "" || plan.DockerfilePath != "Dockerfile" || plan.Base != "debian:bookworm-slim" || plan.Agent != "claude-code" {
		t.Errorf("plan = %+v", plan)
	}
	if plan.UID != 1000 || plan.GID != 1000 {
		t.Errorf("root host user: dev is %d:%d, want 1000:1000", plan.UID, plan.GID)
	}
	if !strings.HasPrefix(plan.Hash, "sha256:") || len(plan.Hash) != len("sha256:")+64 {
		t.Errorf("Hash = %q", plan.Hash)
	}
	want := map[string][]byte{
		"ca-certificates/01-corp.crt":     imagePEM(der),
		"ca-certificates/02-proxy-ca.crt": imagePEM(der2),
	}
	if !reflect.DeepEqual(plan.Files, want) {
		t.Errorf("Files = %q\nwant %q", plan.Files, want)
	}
	df, err := sandbox.DefaultDockerfile(cfg, agent, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(df, plan.Dockerfile) {
		t.Errorf("PlanImage's Dockerfile differs from DefaultDockerfile's")
	}

	entries := imageReadTar(t, plan)
	if got, want := imageEntryNames(entries), []string{"ca-certificates/", "ca-certificates/01-corp.crt", "ca-certificates/02-proxy-ca.crt", "Dockerfile"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("tar entries %q, want %q", got, want)
	}
	for _, e := range entries {
		if e.Uid != 0 || e.Gid != 0 {
			t.Errorf("%s owned by %d:%d", e.Name, e.Uid, e.Gid)
		}
	}
	if entries[3].Data != string(plan.Dockerfile) || entries[1].Data != string(imagePEM(der)) {
		t.Errorf("tar content differs from the plan")
	}
	// The same plan gives the same bytes.
	var a, b bytes.Buffer
	if err := plan.Tar(&a); err != nil {
		t.Fatal(err)
	}
	if err := plan.Tar(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two Tar calls on one generated plan differ")
	}
}

func TestPlanImageCACertErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	imageWriteFile(t, filepath.Join(dir, "garbage.pem"), "not a certificate\n", 0o644)
	imageWriteFile(t, filepath.Join(dir, "key.pem"), "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", 0o644)
	imageWriteFile(t, filepath.Join(dir, "broken.pem"), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0o644)
	for _, tt := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.pem"), "does not exist"},
		{filepath.Join(dir, "garbage.pem"), "holds no certificate"},
		{filepath.Join(dir, "key.pem"), "holds no certificate"},
		{filepath.Join(dir, "broken.pem"), "broken.pem"},
		{"", "empty path"},
	} {
		cfg := sandbox.DefaultConfig()
		cfg.Image.CACertificates = []string{tt.path}
		_, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: dir}, cfg, imageAgent(t, "shell", cfg), 1000, 1000)
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "image.ca_certificates[0]") {
			t.Errorf("%q: err = %v, want ErrInvalid naming image.ca_certificates[0] and %q", tt.path, err, tt.want)
		}
	}
}

func TestPlanImageBadBase(t *testing.T) {
	t.Parallel()
	cfg := sandbox.DefaultConfig()
	cfg.Image.Base = "debian:bookworm slim"
	_, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: t.TempDir()}, cfg, imageAgent(t, "shell", cfg), 1000, 1000)
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "image.base") {
		t.Errorf("err = %v, want ErrInvalid about image.base", err)
	}
}

// TestGeneratedHash: every input of a generated build moves the hash; what
// does not go into the image does not.
func TestGeneratedHash(t *testing.T) {
	t.Parallel()
	certDir := t.TempDir()
	imageWriteFile(t, filepath.Join(certDir, "a.pem"), string(imagePEM(imageTestCert(t, "a"))), 0o644)
	imageWriteFile(t, filepath.Join(certDir, "b.pem"), string(imagePEM(imageTestCert(t, "b"))), 0o644)

	type input struct {
		id       sandbox.Identity
		cfg      sandbox.Config
		agent    string
		uid, gid int
	}
	base := func() input {
		cfg := sandbox.DefaultConfig()
		cfg.Image.CACertificates = []string{filepath.Join(certDir, "a.pem")}
		return input{sandbox.Identity{ProjectDir: certDir, CheckoutSlug: "p-1"}, cfg, "opencode", 1234, 5678}
	}
	hashOf := func(t *testing.T, in input) string {
		t.Helper()
		plan, err := sandbox.PlanImage(in.id, in.cfg, imageAgent(t, in.agent, in.cfg), in.uid, in.gid)
		if err != nil {
			t.Fatal(err)
		}
		return plan.Hash
	}
	ref := hashOf(t, base())
	if again := hashOf(t, base()); again != ref {
		t.Fatalf("the same inputs hash differently: %s, %s", ref, again)
	}
	tests := []struct {
		name    string
		change  func(*input)
		changes bool
	}{
		{"base image", func(in *input) { in.cfg.Image.Base = "ubuntu:24.04" }, true},
		{"agent", func(in *input) { in.agent = "codex" }, true},
		{"install", func(in *input) {
			in.cfg.Agents = map[string]sandbox.AgentProfile{"opencode": {Install: "npm install -g opencode-ai@1.0.0"}}
		}, true},
		{"needs_node", func(in *input) {
			in.agent = "shell"
			in.cfg.Agents = map[string]sandbox.AgentProfile{"shell": {NeedsNode: true}}
		}, true},
		{"uid", func(in *input) { in.uid = 1235 }, true},
		{"gid", func(in *input) { in.gid = 5679 }, true},
		{"CA certificate added", func(in *input) {
			in.cfg.Image.CACertificates = append(in.cfg.Image.CACertificates, filepath.Join(certDir, "b.pem"))
		}, true},
		{"CA certificate replaced", func(in *input) { in.cfg.Image.CACertificates = []string{filepath.Join(certDir, "b.pem")} }, true},
		{"attach command", func(in *input) {
			in.cfg.Agents = map[string]sandbox.AgentProfile{"opencode": {Attach: []string{"opencode"}}}
		}, false},
		{"config file", func(in *input) {
			in.cfg.Agents = map[string]sandbox.AgentProfile{"opencode": {Config: ".config/opencode/opencode.json"}}
		}, false},
		{"identity", func(in *input) { in.id.CheckoutSlug = "q-2"; in.id.RepoSlug = "r" }, false},
		{"resources", func(in *input) { in.cfg.Resources.CPUs = 3 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := base()
			tt.change(&in)
			got := hashOf(t, in)
			if (got != ref) != tt.changes {
				t.Errorf("hash changed: %v, want %v", got != ref, tt.changes)
			}
		})
	}

	t.Run("base image ID and labels", func(t *testing.T) {
		in := base()
		plan, err := sandbox.PlanImage(in.id, in.cfg, imageAgent(t, in.agent, in.cfg), in.uid, in.gid)
		if err != nil {
			t.Fatal(err)
		}
		a := plan.WithBaseImageID("sha256:aaaa")
		b := plan.WithBaseImageID("sha256:bbbb")
		if a.Hash == plan.Hash || a.Hash == b.Hash || a.BaseImageID != "sha256:aaaa" {
			t.Errorf("base image ID not in the hash: %s %s %s", plan.Hash, a.Hash, b.Hash)
		}
		if again := b.WithBaseImageID("sha256:aaaa"); again.Hash != a.Hash {
			t.Errorf("WithBaseImageID is not idempotent: %s vs %s", again.Hash, a.Hash)
		}
		if back := a.WithBaseImageID(""); back.Hash != plan.Hash {
			t.Errorf("clearing the base ID does not restore the hash")
		}
		l1 := a.WithLabels(map[string]string{"x": "1"})
		l2 := a.WithLabels(map[string]string{"x": "2"})
		if l1.Hash == a.Hash || l1.Hash == l2.Hash || l1.Labels["x"] != "1" || a.Labels != nil {
			t.Errorf("labels not in the hash, or WithLabels changed its receiver: %s %s %s", a.Hash, l1.Hash, l2.Hash)
		}
	})
}

// imageProject writes a project with its own Dockerfile and returns its dir.
func imageProject(t *testing.T, dockerfile string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	imageWriteFile(t, filepath.Join(dir, ".agents-sandbox", "Dockerfile"), dockerfile, 0o644)
	for name, data := range files {
		imageWriteFile(t, filepath.Join(dir, filepath.FromSlash(name)), data, 0o644)
	}
	return dir
}

func imagePlanProject(t *testing.T, dir string) sandbox.ImagePlan {
	t.Helper()
	cfg := sandbox.DefaultConfig()
	plan, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: dir}, cfg, imageAgent(t, "shell", cfg), 1234, 5678)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func TestPlanImageCustom(t *testing.T) {
	t.Parallel()
	dir := imageProject(t, "FROM scratch\nCOPY . /src\n", map[string]string{
		".dockerignore":            "# build output\nbuild\n*.log\n!keep.log\nsecret/**\n!secret/public\n",
		"main.go":                  "package main\n",
		"debug.log":                "noise",
		"keep.log":                 "kept",
		"build/out.bin":            "binary",
		"secret/key":               "k",
		"secret/public/cert":       "c",
		"src/a.txt":                "a",
		".git/HEAD":                "ref: refs/heads/main\n",
		".agents-sandbox/setup.sh": "#!/bin/sh\n",
	})
	if err := os.Chmod(filepath.Join(dir, ".agents-sandbox", "setup.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("src/a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "outside")); err != nil {
		t.Fatal(err)
	}
	plan := imagePlanProject(t, dir)
	if !plan.Custom || plan.ContextDir != dir || plan.DockerfilePath != ".agents-sandbox/Dockerfile" || plan.IgnoreFile != filepath.Join(dir, ".dockerignore") {
		t.Errorf("plan = %+v", plan)
	}
	if want := map[string]string{"AGENTS_SANDBOX_UID": "1234", "AGENTS_SANDBOX_GID": "5678"}; !reflect.DeepEqual(plan.BuildArgs, want) {
		t.Errorf("BuildArgs = %v, want %v", plan.BuildArgs, want)
	}
	entries := imageReadTar(t, plan)
	// "secret/**" excludes what is below secret/, not secret/ itself (Docker's rule).
	want := []string{
		".agents-sandbox/", ".agents-sandbox/setup.sh", ".dockerignore", "keep.log", "link", "main.go", "outside",
		"secret/", "secret/public/", "secret/public/cert", "src/", "src/a.txt", ".agents-sandbox/Dockerfile",
	}
	if got := imageEntryNames(entries); !reflect.DeepEqual(got, want) {
		t.Fatalf("tar entries:\n got %q\nwant %q", got, want)
	}
	byName := map[string]imageTarEntry{}
	for _, e := range entries {
		byName[e.Name] = e
		if e.Uid != 0 || e.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want 0:0", e.Name, e.Uid, e.Gid)
		}
	}
	if e := byName["link"]; e.Type != tar.TypeSymlink || e.Link != "src/a.txt" {
		t.Errorf("link = %+v, want a symlink to src/a.txt", e)
	}
	if e := byName["outside"]; e.Type != tar.TypeSymlink || e.Data != "" {
		t.Errorf("outside = %+v, want a symlink, not the file it points to", e)
	}
	if e := byName[".agents-sandbox/setup.sh"]; e.Mode != 0o755 || e.Data != "#!/bin/sh\n" {
		t.Errorf("setup.sh = %+v", e)
	}
	if e := byName[".agents-sandbox/Dockerfile"]; e.Data != "FROM scratch\nCOPY . /src\n" {
		t.Errorf("Dockerfile = %q", e.Data)
	}
}

// The project Dockerfile is in the context even when .dockerignore excludes
// it, and Dockerfile.dockerignore next to it wins over the root .dockerignore.
func TestPlanImageCustomIgnoreFiles(t *testing.T) {
	t.Parallel()
	dir := imageProject(t, "FROM scratch\n", map[string]string{
		".dockerignore": "*\n",
		".agents-sandbox/Dockerfile.dockerignore": ".agents-sandbox\nb.txt\n",
		"a.txt": "a",
		"b.txt": "b",
	})
	plan := imagePlanProject(t, dir)
	if plan.IgnoreFile != filepath.Join(dir, ".agents-sandbox", "Dockerfile.dockerignore") {
		t.Errorf("IgnoreFile = %q", plan.IgnoreFile)
	}
	if got, want := imageEntryNames(imageReadTar(t, plan)), []string{".dockerignore", "a.txt", ".agents-sandbox/Dockerfile"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tar entries %q, want %q", got, want)
	}
	imageWriteFile(t, filepath.Join(dir, ".agents-sandbox", "Dockerfile.dockerignore"), "[\n", 0o644)
	_, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: dir}, sandbox.DefaultConfig(), imageAgent(t, "shell", sandbox.DefaultConfig()), 1, 1)
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "Dockerfile.dockerignore") {
		t.Errorf("malformed pattern: err = %v, want ErrInvalid naming the file", err)
	}
}

// TestCustomHash: the hash is stable across calls and modification times
// and moves with every input of the build.
func TestCustomHash(t *testing.T) {
	t.Parallel()
	files := map[string]string{
		".dockerignore": "*.log\nnode_modules\n",
		"src/main.go":   "package main\n",
		"README.md":     "hello\n",
		"app.log":       "log\n",
		".git/HEAD":     "ref: refs/heads/main\n",
	}
	const df = "FROM scratch\nCOPY src /src\n"
	tests := []struct {
		name    string
		change  func(t *testing.T, dir string)
		changes bool
	}{
		{"nothing", func(t *testing.T, dir string) {}, false},
		{"modification times", func(t *testing.T, dir string) {
			old := time.Now().Add(-48 * time.Hour)
			err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				return os.Chtimes(p, old, old)
			})
			if err != nil {
				t.Fatal(err)
			}
		}, false},
		{"ignored file", func(t *testing.T, dir string) { imageWriteFile(t, filepath.Join(dir, "app.log"), "more log\n", 0o644) }, false},
		{"ignored new dir", func(t *testing.T, dir string) { imageWriteFile(t, filepath.Join(dir, "node_modules/x/i.js"), "x", 0o644) }, false},
		{"git metadata", func(t *testing.T, dir string) {
			imageWriteFile(t, filepath.Join(dir, ".git/HEAD"), "ref: refs/heads/other\n", 0o644)
		}, false},
		{"Dockerfile", func(t *testing.T, dir string) {
			imageWriteFile(t, filepath.Join(dir, ".agents-sandbox/Dockerfile"), df+"ENV X=1\n", 0o644)
		}, true},
		{"file content", func(t *testing.T, dir string) { imageWriteFile(t, filepath.Join(dir, "README.md"), "hello!\n", 0o644) }, true},
		{"file mode", func(t *testing.T, dir string) { imageWriteFile(t, filepath.Join(dir, "README.md"), "hello\n", 0o755) }, true},
		{"new file", func(t *testing.T, dir string) {
			imageWriteFile(t, filepath.Join(dir, "src/util.go"), "package main\n", 0o644)
		}, true},
		{"removed file", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "README.md")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"renamed file", func(t *testing.T, dir string) {
			if err := os.Rename(filepath.Join(dir, "README.md"), filepath.Join(dir, "README.txt")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"empty directory", func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"symlink", func(t *testing.T, dir string) {
			if err := os.Symlink("README.md", filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{".dockerignore brings a file in", func(t *testing.T, dir string) {
			imageWriteFile(t, filepath.Join(dir, ".dockerignore"), "node_modules\n", 0o644)
		}, true},
		{"!.git brings the repository in", func(t *testing.T, dir string) {
			imageWriteFile(t, filepath.Join(dir, ".dockerignore"), "*.log\nnode_modules\n!.git\n", 0o644)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := imageProject(t, df, files)
			before := imagePlanProject(t, dir)
			tt.change(t, dir)
			after := imagePlanProject(t, dir)
			if (after.Hash != before.Hash) != tt.changes {
				t.Errorf("hash changed: %v, want %v", after.Hash != before.Hash, tt.changes)
			}
		})
	}

	t.Run("symlink target", func(t *testing.T) {
		t.Parallel()
		dir := imageProject(t, df, files)
		link := filepath.Join(dir, "link")
		if err := os.Symlink("README.md", link); err != nil {
			t.Fatal(err)
		}
		before := imagePlanProject(t, dir)
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("src/main.go", link); err != nil {
			t.Fatal(err)
		}
		if after := imagePlanProject(t, dir); after.Hash == before.Hash {
			t.Error("a new symlink target kept the hash")
		}
	})
	t.Run("host user", func(t *testing.T) {
		t.Parallel()
		dir := imageProject(t, df, files)
		cfg := sandbox.DefaultConfig()
		a, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: dir}, cfg, imageAgent(t, "shell", cfg), 1000, 1000)
		if err != nil {
			t.Fatal(err)
		}
		b, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: dir}, cfg, imageAgent(t, "shell", cfg), 1001, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if a.Hash == b.Hash {
			t.Error("the AGENTS_SANDBOX_UID build argument is not in the hash")
		}
	})
	t.Run("same content, another directory", func(t *testing.T) {
		t.Parallel()
		a := imagePlanProject(t, imageProject(t, df, files))
		b := imagePlanProject(t, imageProject(t, df, files))
		if a.Hash != b.Hash {
			t.Error("two copies of one project hash differently")
		}
	})
}
