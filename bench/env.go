package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

// benchLabel marks every Docker object the baseline side creates; its value
// is the run id. Our side's objects carry the usual org.agents-sandbox.*
// labels with this run's own checkout slug.
const benchLabel = "org.agents-sandbox.bench"

// agent is the agent every row uses: a plain shell, no daemon, no Node.js.
const agent = "shell"

// Env is what the parent process prepares once and every row's child
// process reuses. It is written as JSON to Root/env.json.
type Env struct {
	RunID    string       `json:"run_id"`
	Root     string       `json:"root"`     // temporary directory holding everything below
	Checkout string       `json:"checkout"` // git checkout with Files small files
	Files    int          `json:"files"`
	Bin      string       `json:"bin"`      // static agents-sandbox binary (the VM's init too)
	XDG      [3]string    `json:"xdg"`      // XDG_CONFIG_HOME, XDG_STATE_HOME, XDG_CACHE_HOME
	Dirs     sandbox.Dirs `json:"dirs"`     // the same, joined with agents-sandbox
	Slug     string       `json:"slug"`     // the checkout slug: our objects carry it
	VM       string       `json:"vm"`       // the project VM's name
	ImageID  string       `json:"image_id"` // the runner image both sides run
	ImageRef string       `json:"image_ref"`
}

// newRunID returns 12 random hex digits.
func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// environ is this process's environment without AGENTS_SANDBOX_* (which
// would become a config layer) and with the XDG directories of e: what our
// CLI processes and the in-process Manager see.
func (e *Env) environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AGENTS_SANDBOX_") || strings.HasPrefix(k, "XDG_CONFIG_HOME") || strings.HasPrefix(k, "XDG_STATE_HOME") || strings.HasPrefix(k, "XDG_CACHE_HOME") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "XDG_CONFIG_HOME="+e.XDG[0], "XDG_STATE_HOME="+e.XDG[1], "XDG_CACHE_HOME="+e.XDG[2])
}

// logger writes warnings and errors to stderr.
func logger() zerolog.Logger {
	return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, NoColor: true}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
}

// manager connects to Docker and returns a Manager and the checkout's project.
func (e *Env) manager(ctx context.Context) (*sandbox.Manager, *docker.Driver, *sandbox.Project, error) {
	d, err := docker.New(ctx, docker.Options{Logger: logger()})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connect to Docker: %w", err)
	}
	m, err := sandbox.NewManager(d, e.Dirs, logger())
	if err != nil {
		return nil, nil, nil, err
	}
	m.InitBinary = e.Bin
	m.Environ = e.environ()
	p, err := m.Open(sandbox.OpenOptions{Dir: e.Checkout, Agent: agent})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open checkout %s: %w", e.Checkout, err)
	}
	return m, d, p, nil
}

// userConfig is the user-level config file (not the checkout's, so no trust
// is needed): the shell agent on the local Debian base, no network.
const userConfig = `agent = "shell"
idle_timeout = "2h"

[image]
base = "debian:bookworm-slim"

[network]
mode = "none"
`

// setup makes the temporary root, the binary, the checkout and the config,
// then creates the project VM once (building the runner image if needed).
func setup(ctx context.Context, f *flags, say func(string, ...any)) (*Env, error) {
	root, err := os.MkdirTemp("", "agents-sandbox-bench-")
	if err != nil {
		return nil, fmt.Errorf("make temporary directory: %w", err)
	}
	root, err = filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	e := &Env{RunID: newRunID(), Root: root, Files: f.files}
	for i, n := range []string{"config", "state", "cache"} {
		e.XDG[i] = filepath.Join(root, "xdg", n)
	}
	e.Dirs = sandbox.Dirs{Config: filepath.Join(e.XDG[0], "agents-sandbox"), State: filepath.Join(e.XDG[1], "agents-sandbox"), Cache: filepath.Join(e.XDG[2], "agents-sandbox")}
	for _, d := range []string{e.Dirs.Config, e.Dirs.State, e.Dirs.Cache} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return e, err
		}
	}
	if err := os.WriteFile(filepath.Join(e.Dirs.Config, "config.toml"), []byte(userConfig), 0o600); err != nil {
		return e, err
	}

	t0 := time.Now()
	if f.bin != "" {
		e.Bin, err = filepath.Abs(f.bin)
		if err != nil {
			return e, err
		}
	} else {
		e.Bin = filepath.Join(root, "agents-sandbox")
		say("building %s (CGO_ENABLED=0)", e.Bin)
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", e.Bin, "./cmd/agents-sandbox")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return e, fmt.Errorf("build agents-sandbox (run from the repository root, or pass -bin): %w", err)
		}
		say("built in %s", time.Since(t0).Round(time.Millisecond))
	}

	t0 = time.Now()
	e.Checkout = filepath.Join(root, "bench-checkout")
	if err := makeCheckout(ctx, e.Checkout, f.files); err != nil {
		return e, err
	}
	say("checkout with %d files in %s", f.files, time.Since(t0).Round(time.Millisecond))

	m, _, p, err := e.manager(ctx)
	if err != nil {
		return e, err
	}
	e.Slug, e.VM = p.ID.CheckoutSlug, p.Names.VM
	t0 = time.Now()
	res, err := m.Create(ctx, p, sandbox.CreateOptions{Progress: func(line string) { say("  %s", line) }})
	if err != nil {
		return e, fmt.Errorf("first create: %w", err)
	}
	e.ImageID, e.ImageRef, e.VM = res.ImageID, res.Image, res.VM
	say("first create: image %s (built: %v), VM %s %s in %s", res.Image, res.ImageBuilt, res.VM, res.Action, time.Since(t0).Round(time.Millisecond))

	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return e, err
	}
	return e, os.WriteFile(filepath.Join(root, "env.json"), data, 0o600)
}

func loadEnv(path string) (*Env, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read bench environment: %w", err)
	}
	var e Env
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("read bench environment %s: %w", path, err)
	}
	return &e, nil
}

// makeCheckout makes a git checkout at dir with n small committed files in
// directories of 100.
func makeCheckout(ctx context.Context, dir string, n int) error {
	for i := 0; i < n; i++ {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				return err
			}
		}
		body := fmt.Sprintf("file %d of the agents-sandbox benchmark checkout\n%s\n", i, strings.Repeat("x", 64))
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d.txt", i%100)), []byte(body), 0o644); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("agents-sandbox benchmark checkout\n"), 0o644); err != nil {
		return err
	}
	git := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	for _, a := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "benchmark checkout"}} {
		if err := git(a...); err != nil {
			return err
		}
	}
	return nil
}

// cleanup removes every Docker object of this run: ours (by the checkout
// slug, which only this run's temporary checkout has) and the baseline's (by
// benchLabel), then the temporary directory. It never touches anything else.
func cleanup(e *Env, say func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	d, err := docker.New(ctx, docker.Options{Logger: logger()})
	if err != nil {
		return fmt.Errorf("cleanup: connect to Docker: %w", err)
	}
	var sets []map[string]string
	if e.Slug != "" {
		sets = append(sets, map[string]string{sandbox.LabelCheckout: e.Slug})
	}
	sets = append(sets, map[string]string{benchLabel: e.RunID})
	var removed []string
	for _, labels := range sets {
		vms, err := d.ListVMs(ctx, labels)
		errs = append(errs, err)
		for _, vm := range vms {
			if err := d.RemoveVM(ctx, vm.Name, true); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				errs = append(errs, err)
			} else {
				removed = append(removed, "container "+vm.Name)
			}
		}
	}
	for _, labels := range sets {
		vols, err := d.ListVolumes(ctx, labels)
		errs = append(errs, err)
		for _, v := range vols {
			if err := d.RemoveVolume(ctx, v.Name); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				errs = append(errs, err)
			} else {
				removed = append(removed, "volume "+v.Name)
			}
		}
	}
	for _, labels := range sets {
		imgs, err := d.ListImages(ctx, labels)
		errs = append(errs, err)
		for _, img := range imgs {
			if err := d.RemoveImage(ctx, img.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				errs = append(errs, err)
			} else {
				removed = append(removed, "image "+strings.Join(img.Tags, ",")+" "+shortID(img.ID))
			}
		}
	}
	say("cleanup: removed %d objects: %s", len(removed), strings.Join(removed, "; "))
	if e.Root != "" && strings.Contains(filepath.Base(e.Root), "agents-sandbox-bench-") {
		errs = append(errs, os.RemoveAll(e.Root))
	}
	return errors.Join(errs...)
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// baselineArgs are the `docker run`/`docker create` options that make a
// baseline container equivalent to our VMs: the same image, no network,
// the same capabilities, no-new-privileges and pids limit, and the bench
// label.
func (e *Env) baselineArgs() []string {
	return []string{
		"--label", benchLabel + "=" + e.RunID,
		"--network", "none",
		"--cap-drop", "ALL",
		"--cap-add", "CHOWN", "--cap-add", "DAC_OVERRIDE", "--cap-add", "FOWNER", "--cap-add", "FSETID",
		"--cap-add", "KILL", "--cap-add", "SETGID", "--cap-add", "SETUID", "--cap-add", "NET_BIND_SERVICE",
		"--security-opt", "no-new-privileges",
		"--pids-limit", "4096",
	}
}

// baselineName is the name of a baseline container or volume of this run.
func (e *Env) baselineName(what string) string {
	return "asb-bench-" + e.RunID + "-" + what
}
