package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// requireNode returns the node binary, after installing tests/node's
// dependencies with `npm ci` when they are missing. Without node or npm the
// test skips locally and fails in CI.
func requireNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = exec.LookPath("npm")
	}
	if err != nil {
		if ci, _ := os.LookupEnv("CI"); ci == "true" || ci == "1" {
			t.Fatalf("node and npm are needed for the TypeScript SDK test: %v", err)
		}
		t.Skipf("node and npm are needed for the TypeScript SDK test: %v", err)
	}
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return node
}

// TestTypeScriptSDKClient runs tests/node/client.mjs: the official
// TypeScript MCP SDK client lists the tools, compiles every schema with Ajv
// in strict draft 2020-12 mode, creates the sandbox, runs a command with
// progress and cancels a long one (checking it is gone from the VM).
func TestTypeScriptSDKClient(t *testing.T) {
	p := sharedProject(t)
	node := requireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", binary, p.dir)
	cmd.Dir = "node"
	cmd.Env = p.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var report struct {
		Tools        []string `json:"tools"`
		Steps        []string `json:"steps"`
		VM           string   `json:"vm"`
		ExecProgress []string `json:"execProgress"`
		Error        string   `json:"error"`
	}
	if jerr := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &report); jerr != nil {
		t.Fatalf("node client: %v; stdout %q\nstderr:\n%s", err, stdout.String(), tail(stderr.String(), 8000))
	}
	if err != nil || report.Error != "" {
		t.Fatalf("node client: %v: %s\nstderr:\n%s", err, report.Error, tail(stderr.String(), 8000))
	}
	if len(report.Tools) != 10 {
		t.Errorf("tools: %v", report.Tools)
	}
	if got := strings.Join(report.Steps, ","); got != "connect,list,create,exec,cancel" {
		t.Errorf("steps %s", got)
	}
	if !strings.Contains(strings.Join(report.ExecProgress, "\n"), "stdout: node-line1") {
		t.Errorf("exec progress: %q", report.ExecProgress)
	}
}
