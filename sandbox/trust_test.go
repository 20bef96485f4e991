package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/internal/gittest"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// The checkout's own settings that reach outside the VM need the user's
// trust, again after every change; narrowing settings need none.
func TestTrustProjectConfig(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "proj")
	gittest.Init(t, dir)
	m := &sandbox.Manager{Dirs: sandbox.Dirs{Config: filepath.Join(root, "config"), State: filepath.Join(root, "state")}, Environ: []string{"HOME=" + root}}
	write := func(body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, ".agents-sandbox"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ".agents-sandbox", "config.toml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(trust bool) error {
		_, err := m.Open(sandbox.OpenOptions{Dir: dir, Trust: trust})
		return err
	}

	// Narrowing egress and plain settings need no trust.
	write("agent = \"shell\"\n[network]\nmode = \"none\"\n[env]\nA = \"1\"\n")
	if err := open(false); err != nil {
		t.Fatalf("narrowing settings: %v", err)
	}

	write("agent = \"shell\"\n[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"api.github.com\"]\n[home]\n\".gitconfig\" = \"\"\n")
	err := open(false)
	if !errors.Is(err, sandbox.ErrUntrusted) || !strings.Contains(err.Error(), "secrets.GH") || !strings.Contains(err.Error(), "agents-sandbox trust") {
		t.Fatalf("untrusted secrets: %v", err)
	}
	if err := open(true); err != nil {
		t.Fatalf("with trust: %v", err)
	}
	if err := open(false); err != nil {
		t.Fatalf("after trusting, unchanged: %v", err)
	}
	p, err := m.Open(sandbox.OpenOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.TrustedSettings(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`home.".gitconfig" = ""`, `secrets.GH = {"from":"env:GH","hosts":["api.github.com"]}`}
	if !slices.Equal(got, want) {
		t.Errorf("TrustedSettings = %q, want %q", got, want)
	}

	// A changed host needs trust again; so do wider egress and mounts.
	for _, body := range []string{
		"agent = \"shell\"\n[secrets.GH]\nfrom = \"env:GH\"\nhosts = [\"api.github.com\", \"evil.example\"]\n[home]\n\".gitconfig\" = \"\"\n",
		"agent = \"shell\"\n[network]\nmode = \"open\"\n",
		"agent = \"shell\"\n[network]\nallow = [\"10.0.0.0/8\"]\n",
		"agent = \"shell\"\n[[mounts]]\nsource = \"/etc\"\ntarget = \"/host-etc\"\n",
	} {
		write(body)
		if err := open(false); !errors.Is(err, sandbox.ErrUntrusted) {
			t.Errorf("changed config %q: err = %v, want ErrUntrusted", body, err)
		}
	}
	// SkipTrust (inspection) never fails on trust.
	if _, err := m.Open(sandbox.OpenOptions{Dir: dir, SkipTrust: true}); err != nil {
		t.Errorf("SkipTrust: %v", err)
	}
}

// An unknown key's error suggests the known key it is closest to.
func TestConfigUnknownKeySuggestion(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for body, want := range map[string]string{
		"idle_timout = \"5m\"\n":                `did you mean "idle_timeout"?`,
		"[secrets.X]\nfromm = \"env:X\"\n":      `did you mean "from"?`,
		"[resources]\ncpu = 2\n":                `did you mean "cpus"?`,
		"completely_unrelated_setting = true\n": "",
	} {
		file := filepath.Join(dir, "config.toml")
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := sandbox.LoadConfig(sandbox.ConfigSources{ProjectFile: file})
		if err == nil || !strings.Contains(err.Error(), "unknown key") {
			t.Fatalf("%q: err = %v, want an unknown key error", body, err)
		}
		if want == "" && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%q: %v suggests a key though none is close", body, err)
		}
		if want != "" && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %s", body, err, want)
		}
	}
}
