package dockerfile_test

import (
	"bytes"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read golden file (run go test ./sandbox/dockerfile -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (go test ./sandbox/dockerfile -update rewrites it):\n--- got\n%s\n--- want\n%s", p, got, want)
	}
}

// TestDefaultDockerfileGolden renders the default Dockerfile for every
// built-in agent as the host user 1234:5678 on the default base.
func TestDefaultDockerfileGolden(t *testing.T) {
	t.Parallel()
	cfg := sandbox.DefaultConfig()
	for _, name := range slices.Sorted(maps.Keys(sandbox.BuiltinAgents())) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			agent, err := sandbox.ResolveAgent(name, cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := sandbox.DefaultDockerfile(cfg, agent, 1234, 5678)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, name+".Dockerfile.golden", got)
		})
	}
}

// TestDefaultDockerfileGoldenVariants covers what the agent goldens do not:
// a root host user, extra CA certificates, another base and a multi-line
// install script of a user-defined agent.
func TestDefaultDockerfileGoldenVariants(t *testing.T) {
	t.Parallel()
	cfg := sandbox.DefaultConfig()
	cfg.Image.Base = "registry.example.com:5000/team/ubuntu:24.04"
	cfg.Image.CACertificates = []string{"/etc/corp/Root CA.pem", "certs/proxy.crt"}
	cfg.Agents = map[string]sandbox.AgentProfile{
		"mytool": {
			Install:  "set -x\nif ! command -v mytool; then\n  curl -fsSL https://example.com/install.sh | sh -s -- --prefix \"/usr/local\"\nfi",
			Attach:   []string{"mytool"},
			Headless: []string{"mytool", "--prompt"},
		},
	}
	agent, err := sandbox.ResolveAgent("mytool", cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sandbox.DefaultDockerfile(cfg, agent, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "variants.Dockerfile.golden", got)
	for _, want := range []string{"uid=1000 gid=1000", "COPY ca-certificates/ ", "#   ca-certificates/01-root-ca.crt", "#   ca-certificates/02-proxy.crt", `"/bin/bash", "-eo", "pipefail", "-c", "set -x\nif`} {
		if !strings.Contains(string(got), want) {
			t.Errorf("the Dockerfile lacks %q", want)
		}
	}
}

// TestGeneratedHashGolden pins the content hash of a generated plan, so that
// a change that moves it (and so rebuilds every user's image once) is a
// deliberate one: rewrite the golden file with -update.
func TestGeneratedHashGolden(t *testing.T) {
	t.Parallel()
	cfg := sandbox.DefaultConfig()
	var out strings.Builder
	for _, name := range slices.Sorted(maps.Keys(sandbox.BuiltinAgents())) {
		agent, err := sandbox.ResolveAgent(name, cfg)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := sandbox.PlanImage(sandbox.Identity{ProjectDir: t.TempDir()}, cfg, agent, 1234, 5678)
		if err != nil {
			t.Fatal(err)
		}
		out.WriteString(name + " " + plan.Hash + "\n")
		withID := plan.WithBaseImageID("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
		out.WriteString(name + "+base-id " + withID.Hash + "\n")
	}
	golden(t, "hashes.golden", []byte(out.String()))
}
