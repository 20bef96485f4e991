package sandbox_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
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
		{"ignored new dir", func(t *testing.T, dir string) {
			imageWriteFile(t, filepath.Join(dir, "node_modules/x/i.js"), "x", 0o644)
		}, false},
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

// ---- Real engine -------------------------------------------------------

// imageTestLabel marks every Docker object these tests create, with a value
// unique to the test, so that cleanup removes exactly those.
const imageTestLabel = "org.agents-sandbox.test"

// imageEngine is the real Docker driver plus what one test created.
type imageEngine struct {
	rt    *docker.Driver
	label string
}

// newImageEngine connects to the engine (skipping without one) and removes
// every VM and image carrying the test's label when the test ends.
func newImageEngine(t *testing.T) *imageEngine {
	t.Helper()
	testenv.RequireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := docker.New(ctx, docker.Options{})
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	e := &imageEngine{rt: d, label: fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())}
	t.Cleanup(func() {
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sel := map[string]string{imageTestLabel: e.label}
		vms, err := d.ListVMs(ctx, sel)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, vm := range vms {
			if err := d.RemoveVM(ctx, vm.Name, true); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		// Images built on images of this test go first: retry until none is left.
		var left []sandbox.Image
		for round := 0; round < 5; round++ {
			left, err = d.ListImages(ctx, sel)
			if err != nil || len(left) == 0 {
				break
			}
			for _, img := range left {
				for _, tag := range img.Tags {
					_ = d.RemoveImage(ctx, tag)
				}
				_ = d.RemoveImage(ctx, img.ID)
			}
		}
		if len(left) > 0 {
			t.Errorf("cleanup: %d images labelled %s=%s are left", len(left), imageTestLabel, e.label)
		}
	})
	return e
}

// project returns the identity and names of a fresh project directory (not
// a git checkout) holding files.
func (e *imageEngine) project(t *testing.T, agent string, files map[string]string) (sandbox.Identity, sandbox.Names) {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		imageWriteFile(t, filepath.Join(dir, filepath.FromSlash(name)), data, 0o644)
	}
	id, err := sandbox.Resolve(dir)
	if err != nil {
		t.Fatal(err)
	}
	return id, id.Names(agent, sandbox.Dirs{Config: t.TempDir(), State: t.TempDir(), Cache: t.TempDir()})
}

// plan plans the image of id with the test's label added.
func (e *imageEngine) plan(t *testing.T, id sandbox.Identity, cfg sandbox.Config, agent string, uid, gid int) sandbox.ImagePlan {
	t.Helper()
	p, err := sandbox.PlanImage(id, cfg, imageAgent(t, agent, cfg), uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	return p.WithLabels(map[string]string{imageTestLabel: e.label})
}

// ensure runs EnsureImage and fails the test on an error.
func (e *imageEngine) ensure(t *testing.T, id sandbox.Identity, names sandbox.Names, plan sandbox.ImagePlan, rebuild bool) sandbox.ImageResult {
	t.Helper()
	res, lines, err := e.tryEnsure(id, names, plan, rebuild)
	if err != nil {
		t.Fatalf("EnsureImage: %v\nbuild output ends:\n%s", err, tail(lines, 30))
	}
	return res
}

func (e *imageEngine) tryEnsure(id sandbox.Identity, names sandbox.Names, plan sandbox.ImagePlan, rebuild bool) (sandbox.ImageResult, []string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var lines []string
	res, err := sandbox.EnsureImage(ctx, e.rt, id, names, plan, rebuild, func(l string) { lines = append(lines, l) })
	return res, lines, err
}

func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run starts a VM from image and runs script in it with bash -lc (sh -c
// when there is no bash) as user, returning its output.
func (e *imageEngine) run(t *testing.T, image, user, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("image-test-%d", time.Now().UnixNano())
	_, err := e.rt.CreateVM(ctx, sandbox.VMSpec{
		Name:       name,
		Image:      image,
		Labels:     map[string]string{sandbox.LabelKind: string(sandbox.KindVM), imageTestLabel: e.label},
		Entrypoint: []string{"sleep", "infinity"},
		Network:    "none",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.rt.RemoveVM(context.WithoutCancel(ctx), name, true) }()
	if err := e.rt.StartVM(ctx, name); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	r, err := e.rt.Exec(ctx, name, sandbox.ExecRequest{Cmd: []string{"bash", "-lc", script}, User: user, Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("script exited %d:\n%s\n%s", r.ExitCode, out.String(), errOut.String())
	}
	return out.String()
}

// readFile reads one file out of image through a created, never started VM.
func (e *imageEngine) readFile(t *testing.T, image, file string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("image-test-%d", time.Now().UnixNano())
	_, err := e.rt.CreateVM(ctx, sandbox.VMSpec{
		Name: name, Image: image, Entrypoint: []string{"/x"}, Network: "none",
		Labels: map[string]string{sandbox.LabelKind: string(sandbox.KindVM), imageTestLabel: e.label},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.rt.RemoveVM(context.WithoutCancel(ctx), name, true) }()
	rc, err := e.rt.CopyFrom(ctx, name, file)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// leftoverProbes fails the test when ImageUser left a probe VM behind.
func (e *imageEngine) leftoverProbes(t *testing.T) {
	t.Helper()
	vms, err := e.rt.ListVMs(context.Background(), map[string]string{imageTestLabel: e.label, sandbox.LabelKind: string(sandbox.KindTask)})
	if err != nil {
		t.Fatal(err)
	}
	if len(vms) > 0 {
		t.Errorf("probe VMs left behind: %v", vms)
	}
}

// TestEnsureImageDefault builds the default image for the shell agent on
// the Debian base (apt-get runs in the build: about a minute without layer
// cache), checks the tools and the dev user inside, then reuses it, and
// builds on a base that already has a user and a group at the wanted ids.
func TestEnsureImageDefault(t *testing.T) {
	e := newImageEngine(t)
	base := testenv.BaseImage(t)
	caDir := t.TempDir()
	der := imageTestCert(t, "agents-sandbox test CA")
	imageWriteFile(t, filepath.Join(caDir, "corp.pem"), string(imagePEM(der)), 0o644)

	cfg := sandbox.DefaultConfig()
	cfg.Image.Base = base
	cfg.Image.CACertificates = []string{filepath.Join(caDir, "corp.pem")}
	id, names := e.project(t, "shell", nil)
	plan := e.plan(t, id, cfg, "shell", 1234, 2345)

	start := time.Now()
	res := e.ensure(t, id, names, plan, false)
	t.Logf("first build: %s", time.Since(start).Round(time.Second))
	if !res.Built || res.Reused || res.Ref != names.RunnerImage || res.User != "dev" || res.Legacy {
		t.Errorf("first EnsureImage = %+v", res)
	}
	if res.Hash == plan.Hash {
		t.Errorf("the base image's ID is not in the hash (%s)", res.Hash)
	}
	wantLabels := map[string]string{
		sandbox.LabelHash: res.Hash, sandbox.LabelKind: "runner", sandbox.LabelAgent: "shell",
		sandbox.LabelCheckout: id.CheckoutSlug, sandbox.LabelProject: id.RepoSlug, sandbox.LabelDir: id.ProjectDir,
		imageTestLabel: e.label,
	}
	for k, v := range wantLabels {
		if res.Image.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, res.Image.Labels[k], v)
		}
	}
	if res.Image.User != "" && res.Image.User != "root" && res.Image.User != "0" {
		t.Errorf("the image's USER is %q, want root (the VM spec picks dev)", res.Image.User)
	}

	out := e.run(t, res.Image.ID, "dev", `set -e
git --version; curl --version | head -n1; rg --version | head -n1; jq --version; bash --version | head -n1
echo "ids $(id -u):$(id -g) $(id -un):$(id -gn)"
echo "home $HOME $(stat -c %u:%g /home/dev) workspace $(pwd) $(stat -c %u:%g /workspace)"
echo "shell $(getent passwd dev | cut -d: -f7)"
echo "env $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE $GIT_SSL_CAINFO"
command -v node || echo "no node"`)
	for _, want := range []string{
		"git version", "curl ", "ripgrep ", "jq-", "GNU bash",
		"ids 1234:2345 dev:dev", "home /home/dev 1234:2345 workspace /workspace 1234:2345", "shell /bin/bash",
		"env " + strings.Repeat("/etc/ssl/certs/ca-certificates.crt ", 3) + "/etc/ssl/certs/ca-certificates.crt", "no node",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the image: %q missing from:\n%s", want, out)
		}
	}
	bundle := e.readFile(t, res.Image.ID, "/etc/ssl/certs/ca-certificates.crt")
	if !strings.Contains(bundle, strings.TrimSpace(string(imagePEM(der)))) {
		t.Error("the extra CA certificate is not in the system bundle")
	}

	start = time.Now()
	again := e.ensure(t, id, names, plan, false)
	if again.Built || !again.Reused || again.Image.ID != res.Image.ID || again.User != "dev" {
		t.Errorf("second EnsureImage = %+v, want the first image reused", again)
	}
	t.Logf("second EnsureImage: %s", time.Since(start).Round(time.Millisecond))

	// A base that already has the ids: "ubuntu" at 1000:1000, as Ubuntu
	// images do. It is made from the image above, so apt-get has little to do.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	takenRef := fmt.Sprintf("agents-sandbox-test/image-ids-taken:%d", time.Now().UnixNano())
	var ctxTar bytes.Buffer
	tw := tar.NewWriter(&ctxTar)
	df := "FROM " + res.Image.ID + "\nRUN userdel -r dev && groupadd -g 1000 ubuntu && useradd -l -u 1000 -g 1000 -m -s /bin/sh ubuntu && touch /home/ubuntu/marker\n"
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(df))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(df)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.BuildImage(ctx, sandbox.BuildRequest{
		Context: &ctxTar, DockerfilePath: "Dockerfile", Tags: []string{takenRef},
		Labels: map[string]string{sandbox.LabelKind: "test", imageTestLabel: e.label},
	}, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		uid, gid   int
		passwd     string
		group      string
		marker     bool
		otherUsers string
	}{
		{"user and group renamed", 1000, 1000, "dev:x:1000:1000::/home/dev:/bin/bash", "dev:x:1000:", true, ""},
		{"group reused, new user", 1500, 1000, "dev:x:1500:1000::/home/dev:/bin/bash", "dev:x:1000:", false, "ubuntu:x:1000:1000::/home/ubuntu:/bin/sh"},
	}
	type built struct {
		id    sandbox.Identity
		names sandbox.Names
		res   sandbox.ImageResult
	}
	var first built
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := sandbox.DefaultConfig()
			cfg.Image.Base = takenRef
			id, names := e.project(t, "shell", nil)
			plan := e.plan(t, id, cfg, "shell", tt.uid, tt.gid)
			res := e.ensure(t, id, names, plan, false)
			if i == 0 {
				first = built{id, names, res}
			}
			passwd := e.readFile(t, res.Image.ID, "/etc/passwd")
			group := e.readFile(t, res.Image.ID, "/etc/group")
			if !strings.Contains(passwd, "\n"+tt.passwd+"\n") {
				t.Errorf("/etc/passwd lacks %q:\n%s", tt.passwd, passwd)
			}
			if !strings.Contains(group, "\n"+tt.group+"\n") {
				t.Errorf("/etc/group lacks %q:\n%s", tt.group, group)
			}
			if tt.otherUsers == "" && strings.Contains(passwd, "ubuntu:") {
				t.Errorf("/etc/passwd still has ubuntu:\n%s", passwd)
			}
			if tt.otherUsers != "" && !strings.Contains(passwd, tt.otherUsers) {
				t.Errorf("/etc/passwd lacks %q:\n%s", tt.otherUsers, passwd)
			}
			out := e.run(t, res.Image.ID, "dev", `echo "$(id -u):$(id -g) $(stat -c %u:%g /home/dev)"; ls -A /home/dev`)
			if want := fmt.Sprintf("%d:%d %d:%d", tt.uid, tt.gid, tt.uid, tt.gid); !strings.HasPrefix(out, want) {
				t.Errorf("as dev: %q, want %q first", out, want)
			}
			if strings.Contains(out, "marker") != tt.marker {
				t.Errorf("ubuntu's home moved to /home/dev: %v, want %v:\n%s", !tt.marker, tt.marker, out)
			}
		})
	}

	// Without the base image's tag the image built from it is kept: a
	// rebuild could not get the base back.
	t.Run("base image gone", func(t *testing.T) {
		if first.res.Image.ID == "" {
			t.Skip("the first build failed")
		}
		if err := e.rt.RemoveImage(ctx, takenRef); err != nil {
			t.Fatal(err)
		}
		if _, err := e.rt.InspectImage(ctx, takenRef); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("%s is still there: %v", takenRef, err)
		}
		cfg := sandbox.DefaultConfig()
		cfg.Image.Base = takenRef
		plan := e.plan(t, first.id, cfg, "shell", 1000, 1000)
		res, lines, err := e.tryEnsure(first.id, first.names, plan, false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Built || !res.Reused || res.Image.ID != first.res.Image.ID || res.Hash != first.res.Hash {
			t.Errorf("EnsureImage = %+v, want %s reused", res, first.res.Image.ID)
		}
		if !strings.Contains(strings.Join(lines, "\n"), "is not on the engine") {
			t.Errorf("progress does not say why: %q", lines)
		}
	})
}

// TestEnsureImageProject builds a project's own Dockerfile (on busybox, no
// network needed): reuse when nothing in the context changed, a build when
// a file or the Dockerfile did, --rebuild, the user probe, and a failing step.
func TestEnsureImageProject(t *testing.T) {
	e := newImageEngine(t)
	busybox := testenv.BusyboxImage(t)
	dockerfile := "FROM " + busybox + "\nARG AGENTS_SANDBOX_UID\nCOPY hello.txt /hello.txt\nRUN echo \"uid=$AGENTS_SANDBOX_UID\" > /uid.txt\n"
	id, names := e.project(t, "shell", map[string]string{
		".agents-sandbox/Dockerfile": dockerfile,
		".dockerignore":              "*.log\n",
		"hello.txt":                  "hello v1\n",
		"build.log":                  "noise\n",
	})
	cfg := sandbox.DefaultConfig()
	plan := func() sandbox.ImagePlan { return e.plan(t, id, cfg, "shell", 1234, 5678) }

	first := e.ensure(t, id, names, plan(), false)
	if !first.Built || first.Reused || first.User != "" {
		t.Errorf("first EnsureImage = %+v, want built, user \"\" (busybox has no dev and no USER)", first)
	}
	if got := e.readFile(t, first.Image.ID, "/hello.txt"); got != "hello v1\n" {
		t.Errorf("/hello.txt = %q", got)
	}
	if got := e.readFile(t, first.Image.ID, "/uid.txt"); got != "uid=1234\n" {
		t.Errorf("/uid.txt = %q, want the AGENTS_SANDBOX_UID build argument", got)
	}
	e.leftoverProbes(t)

	steps := []struct {
		name    string
		change  func()
		rebuild bool
		built   bool
		user    string
	}{
		{"unchanged", func() {}, false, false, ""},
		{"ignored file changed", func() { imageWriteFile(t, filepath.Join(id.ProjectDir, "build.log"), "more\n", 0o644) }, false, false, ""},
		{"rebuild forced", func() {}, true, true, ""},
		{"context file changed", func() { imageWriteFile(t, filepath.Join(id.ProjectDir, "hello.txt"), "hello v2\n", 0o644) }, false, true, ""},
		{"Dockerfile adds dev", func() {
			imageWriteFile(t, filepath.Join(id.ProjectDir, ".agents-sandbox", "Dockerfile"),
				dockerfile+"RUN echo 'dev:x:1234:5678::/home/dev:/bin/sh' >> /etc/passwd\n", 0o644)
		}, false, true, "dev"},
		{"Dockerfile sets USER", func() {
			imageWriteFile(t, filepath.Join(id.ProjectDir, ".agents-sandbox", "Dockerfile"), dockerfile+"USER 4321\n", 0o644)
		}, false, true, "4321"},
		{"unchanged again", func() {}, false, false, "4321"},
	}
	prev := first
	for _, s := range steps {
		s.change()
		res := e.ensure(t, id, names, plan(), s.rebuild)
		if res.Built != s.built || res.Reused == s.built || res.User != s.user {
			t.Errorf("%s: Built %v Reused %v User %q; want built %v, user %q", s.name, res.Built, res.Reused, res.User, s.built, s.user)
		}
		if sameImage := res.Image.ID == prev.Image.ID; sameImage == s.built {
			t.Errorf("%s: image %s after %s", s.name, res.Image.ID, prev.Image.ID)
		}
		if (res.Hash != prev.Hash) != (s.built && !s.rebuild) {
			t.Errorf("%s: hash %s after %s", s.name, res.Hash, prev.Hash)
		}
		prev = res
	}
	if got := e.readFile(t, prev.Image.ID, "/hello.txt"); got != "hello v2\n" {
		t.Errorf("/hello.txt = %q after the change", got)
	}
	e.leftoverProbes(t)

	t.Run("failing step", func(t *testing.T) {
		imageWriteFile(t, filepath.Join(id.ProjectDir, ".agents-sandbox", "Dockerfile"),
			dockerfile+"RUN echo agents-sandbox-fail-marker && exit 3\n", 0o644)
		_, lines, err := e.tryEnsure(id, names, plan(), false)
		if !errors.Is(err, sandbox.ErrBuildFailed) {
			t.Fatalf("err = %v, want ErrBuildFailed", err)
		}
		t.Logf("the error reads: %v", err)
		for _, want := range []string{"RUN echo agents-sandbox-fail-marker && exit 3", "3"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q: %v", want, err)
			}
		}
		if !strings.Contains(strings.Join(lines, "\n"), "agents-sandbox-fail-marker") {
			t.Errorf("the step's output did not reach progress:\n%s", tail(lines, 20))
		}
		// The last good image keeps its tag.
		img, err := e.rt.InspectImage(context.Background(), names.RunnerImage)
		if err != nil || img.ID != prev.Image.ID {
			t.Errorf("after a failed build %s is %v (%v), want %s", names.RunnerImage, img.ID, err, prev.Image.ID)
		}
	})
}

// TestEnsureImageLegacy: an image under the legacy name with the current hash
// is reused under that name; a changed project builds under the new name and
// leaves the legacy image alone.
func TestEnsureImageLegacy(t *testing.T) {
	e := newImageEngine(t)
	busybox := testenv.BusyboxImage(t)
	id, names := e.project(t, "shell", map[string]string{
		".agents-sandbox/Dockerfile": "FROM " + busybox + "\nCOPY a.txt /a.txt\n",
		"a.txt":                      "a\n",
	})
	cfg := sandbox.DefaultConfig()
	plan := e.plan(t, id, cfg, "shell", 1000, 1000)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var buf bytes.Buffer
	if err := plan.Tar(&buf); err != nil {
		t.Fatal(err)
	}
	labels := id.Labels("shell", sandbox.KindRunner)
	labels[sandbox.LabelHash] = plan.Hash
	labels[imageTestLabel] = e.label
	legacy, err := e.rt.BuildImage(ctx, sandbox.BuildRequest{Context: &buf, DockerfilePath: plan.DockerfilePath, Tags: []string{names.LegacyRunnerImage}, Labels: labels}, nil)
	if err != nil {
		t.Fatal(err)
	}

	res := e.ensure(t, id, names, plan, false)
	if res.Built || !res.Reused || !res.Legacy || res.Ref != names.LegacyRunnerImage || res.Image.ID != legacy.ID {
		t.Errorf("EnsureImage = %+v, want the legacy image reused", res)
	}
	if _, err := e.rt.InspectImage(ctx, names.RunnerImage); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("%s exists after reusing the legacy image (err %v)", names.RunnerImage, err)
	}

	imageWriteFile(t, filepath.Join(id.ProjectDir, "a.txt"), "b\n", 0o644)
	res = e.ensure(t, id, names, e.plan(t, id, cfg, "shell", 1000, 1000), false)
	if !res.Built || res.Legacy || res.Ref != names.RunnerImage {
		t.Errorf("EnsureImage after a change = %+v, want a build under %s", res, names.RunnerImage)
	}
	if img, err := e.rt.InspectImage(ctx, names.LegacyRunnerImage); err != nil || img.ID != legacy.ID {
		t.Errorf("the legacy image changed: %v %v", img.ID, err)
	}
}
