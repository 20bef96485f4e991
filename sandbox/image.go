package sandbox

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox/dockerfile"
)

// ProjectDockerfile is where a project's own Dockerfile lives, relative to
// the project directory (and inside the build context).
const ProjectDockerfile = ".agents-sandbox/Dockerfile"

// DevUser is the user the VM and the agent run as in images built from the
// default Dockerfile (and in project images that have one).
const DevUser = "dev"

// Build arguments passed to a project Dockerfile; it may declare them with
// ARG to make a matching user.
const (
	BuildArgUID = "AGENTS_SANDBOX_UID"
	BuildArgGID = "AGENTS_SANDBOX_GID"
)

// LabelHashNoBase is the label holding a default-Dockerfile image's content
// hash without the base image's ID: EnsureImage keeps such an image when the
// base image is no longer on the engine.
const LabelHashNoBase = "org.agents-sandbox.hash-no-base"

// defaultDevID is the dev user's uid and gid when the host user is root.
const defaultDevID = 1000

// imageHashVersion changes whenever what the hash covers changes, so that
// images hashed the old way are rebuilt once.
const imageHashVersion = "agents-sandbox image v1"

// generatedDockerfile is the Dockerfile's name in a generated build context.
const generatedDockerfile = "Dockerfile"

// fixedModTime is the modification time of generated files in a build
// context, so that the same plan always gives the same tar.
var fixedModTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// DevIDs returns the dev user's uid and gid for a host user: the host's own
// ids, except that root (uid 0) maps to 1000:1000 and a gid of 0 maps to
// 1000 (dev never gets root's ids). Negative ids map like 0.
func DevIDs(hostUID, hostGID int) (uid, gid int) {
	if hostUID <= 0 {
		return defaultDevID, defaultDevID
	}
	if hostGID <= 0 {
		return hostUID, defaultDevID
	}
	return hostUID, hostGID
}

// DefaultDockerfile returns the embedded default Dockerfile rendered for
// cfg.Image.Base (debian:bookworm-slim when empty), agent, and a dev user
// made from the host's uid and gid as DevIDs maps them. It is what
// `agents-sandbox build dockerfile` prints and what PlanImage builds when
// the project has no .agents-sandbox/Dockerfile. The image's USER stays
// root; the VM is run as dev. Extra CA certificates (image.ca_certificates)
// are copied from the build context's ca-certificates/ directory, which
// PlanImage fills. Errors wrap ErrInvalid (a base that is not an image
// reference, a bad agent name).
func DefaultDockerfile(cfg Config, agent Agent, uid, gid int) ([]byte, error) {
	certs, err := caCertNames(cfg.Image.CACertificates)
	if err != nil {
		return nil, err
	}
	return renderDefault(cfg, agent, uid, gid, certs)
}

func renderDefault(cfg Config, agent Agent, uid, gid int, certs []string) ([]byte, error) {
	uid, gid = DevIDs(uid, gid)
	b, err := dockerfile.Render(dockerfile.Params{
		Base:      baseImage(cfg),
		Agent:     agent.Name,
		Install:   agent.Install,
		NeedsNode: agent.NeedsNode,
		UID:       uid,
		GID:       gid,
		CACerts:   certs,
	})
	if errors.Is(err, dockerfile.ErrInvalid) {
		return nil, fmt.Errorf("default Dockerfile: %w: %w", ErrInvalid, err)
	}
	return b, err
}

func baseImage(cfg Config) string {
	if cfg.Image.Base == "" {
		return DefaultConfig().Image.Base
	}
	return cfg.Image.Base
}

// caCertNames gives each configured CA certificate a stable name in the
// build context: ca-certificates/<NN>-<sanitized base name>.crt, NN its
// 1-based position in the list.
func caCertNames(paths []string) ([]string, error) {
	names := make([]string, 0, len(paths))
	for i, p := range paths {
		if strings.TrimSpace(p) == "" {
			return nil, fmt.Errorf("image.ca_certificates[%d]: %w: empty path", i, ErrInvalid)
		}
		base := filepath.Base(p)
		base = strings.TrimSuffix(base, filepath.Ext(base))
		names = append(names, fmt.Sprintf("%s/%02d-%s.crt", dockerfile.CACertDir, i+1, SanitizeName(base)))
	}
	return names, nil
}

// ImagePlan is everything one runner image build needs, and the content hash
// that says whether an existing image is still current. PlanImage makes it;
// change BaseImageID and Labels only through WithBaseImageID and WithLabels,
// which keep Hash in step.
type ImagePlan struct {
	// Dockerfile is the Dockerfile's content.
	Dockerfile []byte
	// DockerfilePath is the Dockerfile's path inside the build context:
	// ".agents-sandbox/Dockerfile" for a project Dockerfile, "Dockerfile"
	// for the generated one.
	DockerfilePath string
	// ContextDir is the project directory when Custom (the build context,
	// filtered by IgnorePatterns), empty for the generated Dockerfile.
	ContextDir string
	// IgnorePatterns are the .dockerignore patterns applied to ContextDir:
	// ".git" first (the repository is not part of the image unless a
	// "!.git" pattern brings it back), then the project's own.
	IgnorePatterns []string
	// IgnoreFile is the .dockerignore file read, "" when none.
	IgnoreFile string
	// Files are the generated build context's extra files by
	// '/'-separated path (the CA certificates, "ca-certificates/01-corp.crt").
	Files map[string][]byte
	// BuildArgs are passed to the build (AGENTS_SANDBOX_UID and
	// AGENTS_SANDBOX_GID for a project Dockerfile).
	BuildArgs map[string]string
	// Labels are extra image labels beyond the identity labels and the hash.
	Labels map[string]string
	// Custom is true for the project's own .agents-sandbox/Dockerfile.
	Custom bool
	// Agent is the agent's name.
	Agent string
	// Base is the base image reference of the generated Dockerfile.
	Base string
	// BaseImageID is the base image's ID when known ("sha256:…"); it is part
	// of Hash, so that a new base image rebuilds.
	BaseImageID string
	// UID and GID are the dev user's ids in the generated image, and the
	// values of the build arguments for a project Dockerfile.
	UID, GID int
	// Hash is the content hash ("sha256:<64 hex>") of everything that goes
	// into the build; it is stored as the org.agents-sandbox.hash label.
	Hash string

	// contentHash is Hash before BaseImageID and Labels are folded in.
	contentHash string
}

// PlanImage decides how the runner image of id and agent is built and
// computes its content hash.
//
// With <project>/.agents-sandbox/Dockerfile the build context is the project
// directory minus what .agents-sandbox/Dockerfile.dockerignore or, without
// it, <project>/.dockerignore excludes (Docker's semantics; ".git" is
// excluded unless a "!.git" pattern re-includes it), and the hash covers the
// Dockerfile, every file in the context (path, mode bits, content; symlinks
// as their target, never followed; modification times do not count) and
// the build arguments. Sockets, pipes and devices are left out.
//
// Otherwise the default Dockerfile is rendered (see DefaultDockerfile) on
// cfg.Image.Base, the image.ca_certificates files are read into Files, and
// the hash covers the Dockerfile, those files, the base image reference and
// the agent's name and install fields (its other fields do not change the
// image). WithBaseImageID folds the base image's ID in.
//
// hostUID and hostGID are the host user's ids (see DevIDs). Relative CA
// certificate paths are taken relative to the project directory, "~/" to the
// home directory. Errors: an unreadable Dockerfile, .dockerignore or context
// file; ErrInvalid for a CA certificate that is missing or holds no
// certificate, a malformed .dockerignore pattern, a bad base image reference.
func PlanImage(id Identity, cfg Config, agent Agent, hostUID, hostGID int) (ImagePlan, error) {
	uid, gid := DevIDs(hostUID, hostGID)
	plan := ImagePlan{Agent: agent.Name, UID: uid, GID: gid}
	dfPath := filepath.Join(id.ProjectDir, filepath.FromSlash(ProjectDockerfile))
	fi, err := os.Stat(dfPath)
	switch {
	case id.ProjectDir == "":
		// No project directory: nothing to look for (and nothing relative
		// to the working directory is picked up by accident).
	case err == nil && fi.Mode().IsRegular():
		return planCustom(plan, id, dfPath)
	case err == nil:
		return ImagePlan{}, fmt.Errorf("plan image: %w: %s is not a regular file", ErrInvalid, dfPath)
	case !errors.Is(err, fs.ErrNotExist):
		return ImagePlan{}, fmt.Errorf("plan image: %w", err)
	}

	plan.Base = baseImage(cfg)
	plan.DockerfilePath = generatedDockerfile
	names, err := caCertNames(cfg.Image.CACertificates)
	if err != nil {
		return ImagePlan{}, fmt.Errorf("plan image: %w", err)
	}
	plan.Files = make(map[string][]byte, len(names))
	for i, p := range cfg.Image.CACertificates {
		pemData, err := readCACert(resolveHostPath(p, id.ProjectDir))
		if err != nil {
			return ImagePlan{}, fmt.Errorf("plan image: image.ca_certificates[%d]: %w", i, err)
		}
		plan.Files[names[i]] = pemData
	}
	plan.Dockerfile, err = renderDefault(cfg, agent, uid, gid, names)
	if err != nil {
		return ImagePlan{}, fmt.Errorf("plan image: %w", err)
	}
	h := newFieldHash()
	h.field("version", imageHashVersion)
	h.field("kind", "generated")
	h.field("dockerfile", string(plan.Dockerfile))
	for _, name := range slices.Sorted(maps.Keys(plan.Files)) {
		h.field("file", name)
		h.field("content", string(plan.Files[name]))
	}
	h.field("base", plan.Base)
	h.field("agent", agent.Name)
	h.field("install", agent.Install)
	h.field("needs-node", strconv.FormatBool(agent.NeedsNode))
	plan.contentHash = h.sum()
	plan.rehash()
	return plan, nil
}

func planCustom(plan ImagePlan, id Identity, dfPath string) (ImagePlan, error) {
	df, err := os.ReadFile(dfPath)
	if err != nil {
		return ImagePlan{}, fmt.Errorf("plan image: read %s: %w", dfPath, err)
	}
	plan.Custom = true
	plan.Dockerfile = df
	plan.DockerfilePath = ProjectDockerfile
	plan.ContextDir = id.ProjectDir
	plan.BuildArgs = map[string]string{
		BuildArgUID: strconv.Itoa(plan.UID),
		BuildArgGID: strconv.Itoa(plan.GID),
	}
	plan.IgnorePatterns = []string{".git"}
	for _, cand := range []string{dfPath + ".dockerignore", filepath.Join(id.ProjectDir, ".dockerignore")} {
		f, err := os.Open(cand)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return ImagePlan{}, fmt.Errorf("plan image: %w", err)
		}
		pats, err := dockerfile.ReadIgnore(f)
		_ = f.Close()
		if err != nil {
			return ImagePlan{}, fmt.Errorf("plan image: %s: %w", cand, err)
		}
		plan.IgnoreFile = cand
		plan.IgnorePatterns = append(plan.IgnorePatterns, pats...)
		break
	}
	m, err := plan.matcher()
	if err != nil {
		return ImagePlan{}, fmt.Errorf("plan image: %w", err)
	}
	h := newFieldHash()
	h.field("version", imageHashVersion)
	h.field("kind", "custom")
	h.field("dockerfile-path", plan.DockerfilePath)
	h.field("dockerfile", string(df))
	for _, k := range slices.Sorted(maps.Keys(plan.BuildArgs)) {
		h.field("build-arg", k+"="+plan.BuildArgs[k])
	}
	err = walkContext(plan.ContextDir, m, func(e contextEntry) error {
		h.field("path", e.rel)
		h.field("mode", strconv.FormatUint(uint64(e.perm()), 8))
		switch {
		case e.info.IsDir():
			h.field("type", "dir")
		case e.info.Mode()&fs.ModeSymlink != 0:
			h.field("type", "symlink")
			h.field("target", e.link)
		default:
			h.field("type", "file")
			sum, err := fileSHA256(e.abs)
			if err != nil {
				return err
			}
			h.field("sha256", sum)
		}
		return nil
	})
	if err != nil {
		return ImagePlan{}, fmt.Errorf("plan image: hash build context %s: %w", plan.ContextDir, err)
	}
	plan.contentHash = h.sum()
	plan.rehash()
	return plan, nil
}

// WithBaseImageID returns the plan with the base image's ID folded into its
// hash (generated Dockerfile; ignored for a project Dockerfile, whose base
// images are its own business). EnsureImage calls it with the ID the engine
// reports.
func (p ImagePlan) WithBaseImageID(imageID string) ImagePlan {
	if p.Custom {
		return p
	}
	p.BaseImageID = imageID
	p.rehash()
	return p
}

// WithLabels returns the plan with extra image labels (merged over earlier
// ones), folded into its hash: an image without them is not current.
func (p ImagePlan) WithLabels(labels map[string]string) ImagePlan {
	merged := maps.Clone(p.Labels)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, labels)
	p.Labels = merged
	p.rehash()
	return p
}

func (p *ImagePlan) rehash() {
	if p.BaseImageID == "" && len(p.Labels) == 0 {
		p.Hash = "sha256:" + p.contentHash
		return
	}
	h := newFieldHash()
	h.field("content", p.contentHash)
	h.field("base-id", p.BaseImageID)
	for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
		h.field("label", k+"="+p.Labels[k])
	}
	p.Hash = "sha256:" + h.sum()
}

func (p ImagePlan) matcher() (*dockerfile.Matcher, error) {
	m, err := dockerfile.NewMatcher(p.IgnorePatterns)
	if err != nil {
		src := p.IgnoreFile
		if src == "" {
			src = ".dockerignore"
		}
		return nil, fmt.Errorf("%s: %w: %w", src, ErrInvalid, err)
	}
	return m, nil
}

// Tar writes the plan's build context to w as an uncompressed tar: for a
// project Dockerfile the filtered project directory in lexical order (owner
// root, modification times kept, symlinks as links) with the Dockerfile as
// planned at .agents-sandbox/Dockerfile; for the generated one, Files and
// the Dockerfile at "Dockerfile", all with a fixed time. The same plan and
// files give the same entries in the same order. Errors come from reading the
// context or writing w.
func (p ImagePlan) Tar(w io.Writer) error {
	tw := tar.NewWriter(w)
	if p.Custom {
		m, err := p.matcher()
		if err != nil {
			return fmt.Errorf("write build context: %w", err)
		}
		err = walkContext(p.ContextDir, m, func(e contextEntry) error { return writeEntry(tw, e) })
		if err != nil {
			return fmt.Errorf("write build context %s: %w", p.ContextDir, err)
		}
	} else {
		dirs := map[string]bool{}
		for _, name := range slices.Sorted(maps.Keys(p.Files)) {
			for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
				dirs[d] = true
			}
		}
		for _, d := range slices.Sorted(maps.Keys(dirs)) {
			if err := writeGenerated(tw, d+"/", nil, tar.TypeDir, 0o755); err != nil {
				return err
			}
		}
		for _, name := range slices.Sorted(maps.Keys(p.Files)) {
			if err := writeGenerated(tw, name, p.Files[name], tar.TypeReg, 0o644); err != nil {
				return err
			}
		}
	}
	if err := writeGenerated(tw, p.DockerfilePath, p.Dockerfile, tar.TypeReg, 0o644); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write build context: %w", err)
	}
	return nil
}

func writeGenerated(tw *tar.Writer, name string, data []byte, typ byte, mode int64) error {
	hdr := &tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: int64(len(data)), ModTime: fixedModTime, Format: tar.FormatPAX}
	if typ == tar.TypeDir {
		hdr.Size = 0
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write build context: %s: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write build context: %s: %w", name, err)
	}
	return nil
}

// contextEntry is one file, directory or symlink of a project build context.
type contextEntry struct {
	rel  string // '/'-separated path relative to the context root
	abs  string
	info fs.FileInfo
	link string // symlink target
}

func (e contextEntry) perm() fs.FileMode {
	return e.info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// walkContext calls fn for every directory, regular file and symlink under
// root that m does not exclude, in lexical order, never following symlinks.
// The project Dockerfile is left out (Tar writes the planned content).
func walkContext(root string, m *dockerfile.Matcher, fn func(contextEntry) error) error {
	return filepath.WalkDir(root, func(abs string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if abs == root {
			return nil
		}
		rel, err := filepath.Rel(root, abs)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == ProjectDockerfile {
			return nil
		}
		if m.Excluded(rel) {
			if d.IsDir() && m.SkipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := contextEntry{rel: rel, abs: abs, info: info}
		switch mode := info.Mode(); {
		case mode.IsDir(), mode.IsRegular():
		case mode&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(abs); err != nil {
				return err
			}
		default:
			return nil // sockets, pipes, devices
		}
		return fn(e)
	})
}

func writeEntry(tw *tar.Writer, e contextEntry) error {
	hdr, err := tar.FileInfoHeader(e.info, e.link)
	if err != nil {
		return fmt.Errorf("%s: %w", e.rel, err)
	}
	hdr.Name = e.rel
	if e.info.IsDir() {
		hdr.Name += "/"
	}
	hdr.Mode = int64(e.perm() & fs.ModePerm)
	if e.info.Mode()&fs.ModeSetuid != 0 {
		hdr.Mode |= 0o4000
	}
	if e.info.Mode()&fs.ModeSetgid != 0 {
		hdr.Mode |= 0o2000
	}
	if e.info.Mode()&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", e.rel, err)
	}
	if !e.info.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(e.abs)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(tw, f)
	if err != nil {
		return fmt.Errorf("%s: %w", e.rel, err)
	}
	if n != e.info.Size() {
		return fmt.Errorf("%s: changed while being read (%d bytes, expected %d)", e.rel, n, e.info.Size())
	}
	return nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fieldHash hashes named, length-prefixed fields, so that no two different
// field sequences hash alike.
type fieldHash struct{ h hash.Hash }

func newFieldHash() fieldHash { return fieldHash{sha256.New()} }

func (f fieldHash) field(name, value string) {
	fmt.Fprintf(f.h, "%s %d\n%s\n", name, len(value), value)
}

func (f fieldHash) sum() string { return hex.EncodeToString(f.h.Sum(nil)) }

// resolveHostPath makes a configured host path absolute: "~/" against the
// home directory, a relative path against base.
func resolveHostPath(p, base string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, strings.TrimPrefix(strings.TrimPrefix(p, "~"), "/"))
		}
	}
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(base, p)
}

// readCACert reads a CA certificate file (PEM, possibly several
// certificates, or one DER certificate) and returns its certificates as PEM.
// Errors wrap ErrInvalid for a missing file or one without a certificate.
func readCACert(p string) ([]byte, error) {
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: CA certificate %s does not exist", ErrInvalid, p)
	}
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	var out bytes.Buffer
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("%w: CA certificate %s: %w", ErrInvalid, p, err)
		}
		if err := pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}); err != nil {
			return nil, fmt.Errorf("encode CA certificate %s: %w", p, err)
		}
	}
	if out.Len() > 0 {
		return out.Bytes(), nil
	}
	if cert, err := x509.ParseCertificate(data); err == nil {
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), nil
	}
	return nil, fmt.Errorf("%w: CA certificate %s holds no certificate (PEM \"BEGIN CERTIFICATE\" or DER)", ErrInvalid, p)
}

// ImageResult is what EnsureImage did.
type ImageResult struct {
	// Image is the runner image as the runtime reports it.
	Image Image `json:"image"`
	// Ref is the tag the VM is created from: the runner image name, or the
	// legacy name when a legacy image was reused.
	Ref string `json:"ref"`
	// Hash is the content hash the image carries (org.agents-sandbox.hash).
	Hash string `json:"hash"`
	// Built is true when the image was built by this call.
	Built bool `json:"built"`
	// Reused is true when an existing image with the same hash was kept.
	Reused bool `json:"reused"`
	// Legacy is true when the reused image carries the legacy name.
	Legacy bool `json:"legacy,omitempty"`
	// User is the user the VM runs as: "dev" for the default Dockerfile and
	// for a project image that has a dev user, else the image's USER (""
	// meaning the runtime's default, root).
	User string `json:"user"`
	// Duration is how long EnsureImage took.
	Duration time.Duration `json:"duration_ns"`
}

// EnsureImage makes sure the runner image for plan exists. Unless rebuild is
// set, an image tagged names.RunnerImage, then names.LegacyRunnerImage, whose
// org.agents-sandbox.hash label equals the plan's hash is reused (a legacy
// image is only ever reused, never rebuilt under its old name). Otherwise the
// image is built (without layer cache when rebuild is set) with the identity
// labels of kind runner, the hash label, the project directory label and
// plan.Labels, and tagged names.RunnerImage. For the default Dockerfile the
// base image's ID, when the engine has the base, is folded into the hash
// first (WithBaseImageID); when the engine does not have the base (its tag was
// removed), an image whose org.agents-sandbox.hash-no-base label matches is
// kept rather than rebuilt from a base that may not be pullable. For a
// project Dockerfile the image is probed with ImageUser for the user the VM
// runs as.
//
// Build output goes to progress (may be nil) line by line. The caller holds
// the checkout lock: two concurrent calls for one checkout both build.
// Errors: a failed build wraps ErrBuildFailed and quotes the failing step;
// ErrRuntimeUnavailable when the engine does not answer.
func EnsureImage(ctx context.Context, rt Runtime, id Identity, names Names, plan ImagePlan, rebuild bool, progress ProgressFunc) (ImageResult, error) {
	start := time.Now()
	say := func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	// withoutBase is the hash as if the base image's ID were unknown; it is
	// stored too, so that an image stays usable when the base image's tag
	// is gone from the engine (a rebuild could not pull it back without a
	// registry).
	withoutBase := plan.WithBaseImageID("").Hash
	baseMissing := false
	if !plan.Custom && plan.BaseImageID == "" {
		base, err := rt.InspectImage(ctx, plan.Base)
		switch {
		case err == nil:
			plan = plan.WithBaseImageID(base.ID)
		case errors.Is(err, ErrNotFound):
			// The build pulls it, or fails saying it is missing.
			baseMissing = true
		default:
			return ImageResult{}, fmt.Errorf("inspect base image %q: %w", plan.Base, err)
		}
	}
	res := ImageResult{Hash: plan.Hash}
	finish := func(img Image, ref string) (ImageResult, error) {
		res.Image, res.Ref = img, ref
		res.User = DevUser
		if plan.Custom {
			u, err := ImageUser(ctx, rt, img)
			if err != nil {
				return ImageResult{}, err
			}
			res.User = u
		}
		res.Duration = time.Since(start)
		return res, nil
	}

	if !rebuild {
		for _, ref := range []string{names.RunnerImage, names.LegacyRunnerImage} {
			if ref == "" {
				continue
			}
			img, err := rt.InspectImage(ctx, ref)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return ImageResult{}, fmt.Errorf("inspect image %q: %w", ref, err)
			}
			current := img.Labels[LabelHash] == plan.Hash
			if !current && baseMissing && img.Labels[LabelHashNoBase] == withoutBase {
				say("base image %s is not on the engine; keeping image %s built from it", plan.Base, ref)
				current = true
			}
			if current {
				say("image %s is up to date (%s)", ref, shortHash(img.Labels[LabelHash]))
				res.Hash = img.Labels[LabelHash]
				res.Reused, res.Legacy = true, ref == names.LegacyRunnerImage
				return finish(img, ref)
			}
		}
	}

	labels := id.Labels(plan.Agent, KindRunner)
	maps.Copy(labels, plan.Labels)
	labels[LabelHash] = plan.Hash
	if !plan.Custom {
		labels[LabelHashNoBase] = withoutBase
	}
	if id.ProjectDir != "" {
		labels[LabelDir] = id.ProjectDir
	}
	what := "the default Dockerfile on " + plan.Base
	if plan.Custom {
		what = filepath.Join(plan.ContextDir, filepath.FromSlash(plan.DockerfilePath))
	}
	say("building image %s from %s (%s)", names.RunnerImage, what, shortHash(plan.Hash))

	build := func() (Image, error, error) {
		pr, pw := io.Pipe()
		tarDone := make(chan error, 1)
		go func() {
			err := plan.Tar(pw)
			_ = pw.CloseWithError(err)
			tarDone <- err
		}()
		img, err := rt.BuildImage(ctx, BuildRequest{
			Context:        pr,
			DockerfilePath: plan.DockerfilePath,
			Tags:           []string{names.RunnerImage},
			Labels:         labels,
			BuildArgs:      plan.BuildArgs,
			NoCache:        rebuild,
		}, progress)
		// The builder may stop reading early (a failed build): unblock the writer.
		_ = pr.CloseWithError(errBuildDone)
		tarErr := <-tarDone
		if errors.Is(tarErr, errBuildDone) {
			tarErr = nil
		}
		return img, err, tarErr
	}
	img, err, tarErr := build()
	if err != nil && tarErr == nil && cacheRace(err) {
		// Another build's image was removed with its untagged parents
		// while this build stood on one of them as layer cache (the
		// classic builder's cache is shared): build once more.
		say("a cached layer vanished during the build (an image was removed meanwhile); building again")
		img, err, tarErr = build()
	}
	switch {
	case tarErr != nil && err != nil:
		return ImageResult{}, fmt.Errorf("ensure runner image %s: write build context: %w (build: %w)", names.RunnerImage, tarErr, err)
	case tarErr != nil:
		return ImageResult{}, fmt.Errorf("ensure runner image %s: write build context: %w", names.RunnerImage, tarErr)
	case err != nil:
		return ImageResult{}, fmt.Errorf("ensure runner image: %w", err)
	}
	if img.Labels[LabelHash] != plan.Hash {
		// Some runtimes report the image before labels; ask again by tag.
		if again, err := rt.InspectImage(ctx, names.RunnerImage); err == nil {
			img = again
		}
	}
	res.Built = true
	say("built image %s in %s", names.RunnerImage, time.Since(start).Round(100*time.Millisecond))
	return finish(img, names.RunnerImage)
}

// cacheRace reports whether a failed build lost a cached layer that was
// removed during the build.
func cacheRace(err error) bool {
	msg := err.Error()
	return errors.Is(err, ErrBuildFailed) && (strings.Contains(msg, "failed to get digest") || strings.Contains(msg, "No such image") || strings.Contains(msg, "no such image"))
}

// errBuildDone ends the build context's pipe once the builder returned.
var errBuildDone = errors.New("build finished")

func shortHash(h string) string {
	h = strings.TrimPrefix(h, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return "hash " + h
}

// ImageUser returns the user a VM made from img runs as: "dev" when the
// image's /etc/passwd has a dev user, else the image's configured USER (""
// meaning the runtime's default, root).
//
// It creates a VM from the image without starting it (no network, never
// run), reads /etc/passwd out of it with CopyFrom and removes it again, so it
// works for images without a shell. The probe VM carries the image's labels
// with kind "task"; it is removed even when ctx is cancelled. An image
// without /etc/passwd has no dev user. Errors come from the runtime.
func ImageUser(ctx context.Context, rt Runtime, img Image) (string, error) {
	ref := img.ID
	if ref == "" && len(img.Tags) > 0 {
		ref = img.Tags[0]
	}
	if ref == "" {
		return "", fmt.Errorf("probe image user: %w: the image has no ID or tag", ErrInvalid)
	}
	labels := maps.Clone(img.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelKind] = string(KindTask)
	prefix := "probe"
	if c := labels[LabelCheckout]; c != "" {
		prefix = c + "-probe"
	}
	name := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	if _, err := rt.CreateVM(ctx, VMSpec{
		Name:       name,
		Image:      ref,
		Labels:     labels,
		Entrypoint: []string{"/nonexistent/agents-sandbox-probe"},
		Cmd:        []string{},
		Network:    "none",
	}); err != nil {
		return "", fmt.Errorf("probe image user of %s: %w", ref, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = rt.RemoveVM(cctx, name, true)
	}()
	hasDev, err := passwdHasUser(ctx, rt, name, "/etc/passwd", DevUser)
	if err != nil {
		return "", fmt.Errorf("probe image user of %s: %w", ref, err)
	}
	if hasDev {
		return DevUser, nil
	}
	return img.User, nil
}

// passwdHasUser reads a passwd file out of a VM and reports whether it names
// user. One level of symlink is followed; a missing file has no users.
func passwdHasUser(ctx context.Context, rt Runtime, vm, file, user string) (bool, error) {
	for hops := 0; hops < 2; hops++ {
		rc, err := rt.CopyFrom(ctx, vm, file)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		hdr, data, err := readFirstTarEntry(rc, 4<<20)
		_ = rc.Close()
		if err != nil {
			return false, fmt.Errorf("read %s: %w", file, err)
		}
		if hdr.Typeflag == tar.TypeSymlink {
			target := hdr.Linkname
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(file), target)
			}
			file = target
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if name, _, ok := strings.Cut(sc.Text(), ":"); ok && name == user {
				return true, nil
			}
		}
		return false, nil
	}
	return false, nil
}

func readFirstTarEntry(r io.Reader, limit int64) (*tar.Header, []byte, error) {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(io.LimitReader(tr, limit))
	if err != nil {
		return nil, nil, err
	}
	// Drain the stream so the runtime's connection ends cleanly.
	_, _ = io.Copy(io.Discard, r)
	return hdr, data, nil
}
