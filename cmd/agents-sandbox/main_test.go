package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
)

// run calls Main in-process with a clean, isolated environment.
func run(t *testing.T, _ string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	home := t.TempDir()
	env := []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, "config"), "XDG_STATE_HOME=" + filepath.Join(home, "state"), "PATH=" + os.Getenv("PATH")}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		env = append(env, "DOCKER_HOST="+h)
	}
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, Streams{In: strings.NewReader(""), Out: &out, Err: &errb}, env)
	return code, out.String(), errb.String()
}

func gitInit(t *testing.T) string {
	t.Helper()
	testenv.RequireGit(t)
	dir := t.TempDir()
	cmd := exec.Command("git", "init", "-q", dir)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	return dir
}

func TestVersionAndHelp(t *testing.T) {
	code, out, _ := run(t, "", "version")
	if code != 0 || !strings.HasPrefix(out, "agents-sandbox ") {
		t.Fatalf("version: code %d, out %q", code, out)
	}
	code, out, _ = run(t, "", "--help")
	for _, want := range []string{"run", "create", "exec", "task", "doctor", "identity", "config"} {
		if code != 0 || !strings.Contains(out, "\n  "+want) {
			t.Errorf("--help lacks the %q command (code %d)", want, code)
		}
	}
	if strings.Contains(out, "vm-init") {
		t.Error("--help lists the hidden vm-init command")
	}
}

func TestUsageErrorsExit2WithoutStackTrace(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"no-such-command"}, {"identity", "a", "b"}, {"--log-level", "loud", "version"}} {
		code, out, errOut := run(t, "", args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errOut)
		}
		if out != "" {
			t.Errorf("%v: wrote to stdout: %q", args, out)
		}
		if !strings.HasPrefix(errOut, "agents-sandbox: ") || strings.Contains(errOut, "goroutine") {
			t.Errorf("%v: stderr %q", args, errOut)
		}
	}
}

func TestIdentityJSON(t *testing.T) {
	dir := gitInit(t)
	code, out, errOut := run(t, "", "identity", "--json", "--agent", "shell", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		ProjectDir   string `json:"project_dir"`
		CheckoutSlug string `json:"checkout_slug"`
		Names        struct {
			VM          string `json:"vm"`
			RunnerImage string `json:"runner_image"`
		} `json:"names"`
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	real, _ := filepath.EvalSymlinks(dir)
	if got.ProjectDir != real || got.Names.VM != got.CheckoutSlug+"-shell" || got.Names.RunnerImage != "agents-sandbox/runner-"+got.CheckoutSlug+":shell-latest" {
		t.Errorf("identity: %+v", got)
	}
	if got.Labels["org.agents-sandbox.checkout"] != got.CheckoutSlug {
		t.Errorf("labels: %v", got.Labels)
	}
}

func TestConfigShowOrigins(t *testing.T) {
	dir := gitInit(t)
	if err := os.MkdirAll(filepath.Join(dir, ".agents-sandbox"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".agents-sandbox", "config.toml"), []byte("agent = \"shell\"\n[resources]\ncpus = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "config", "show", "--json", "--dir", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Config  map[string]any    `json:"config"`
		Origins map[string]string `json:"origins"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if got.Origins["agent"] != "project" || got.Origins["resources.cpus"] != "project" || got.Origins["idle_timeout"] != "default" {
		t.Errorf("origins: %v", got.Origins)
	}
	// A bad key names the file and the key, exit 2.
	if err := os.WriteFile(filepath.Join(dir, ".agents-sandbox", "config.toml"), []byte("agentt = \"shell\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run(t, "", "config", "show", "--dir", dir)
	if code != 2 || !strings.Contains(errOut, "config.toml") || !strings.Contains(errOut, "agentt") {
		t.Errorf("unknown key: exit %d, stderr %q", code, errOut)
	}
}

func TestDoctorReportsWorkingEngine(t *testing.T) {
	testenv.RequireDocker(t)
	code, out, errOut := run(t, "", "doctor", "--json")
	var got struct {
		OK     bool `json:"ok"`
		Checks []struct {
			Name   string `json:"name"`
			OK     bool   `json:"ok"`
			Detail string `json:"detail"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("doctor --json: %v\n%s\n%s", err, out, errOut)
	}
	found := false
	for _, c := range got.Checks {
		if c.Name == "docker engine" {
			found = true
			if !c.OK || !strings.Contains(c.Detail, "API 1.") {
				t.Errorf("docker engine check: %+v", c)
			}
		}
	}
	if !found || code != 0 || !got.OK {
		t.Errorf("doctor: exit %d, ok %v, checks %+v", code, got.OK, got.Checks)
	}
}

func TestDoctorWithoutEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	code, out, _ := run(t, "", "doctor")
	if code != 1 || !strings.Contains(out, "[FAIL] docker engine") || !strings.Contains(out, "fix:") {
		t.Errorf("doctor without engine: exit %d\n%s", code, out)
	}
}
