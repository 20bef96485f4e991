// Package testbin builds the agents-sandbox binary for tests: static
// (CGO_ENABLED=0), because tests copy it into VMs as their init.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

var (
	once sync.Once
	path string
	bErr error
	bOut []byte
)

// Path builds ./cmd/agents-sandbox once per test process into a temp dir
// and returns the binary's path. The go build cache makes later builds in
// other packages fast. It fails the test when the build fails.
func Path(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		// One parent for every test process's binary; binaries of earlier
		// runs older than an hour are removed.
		parent := filepath.Join(os.TempDir(), "agents-sandbox-testbin")
		if err := os.MkdirAll(parent, 0o755); err != nil {
			bErr = err
			return
		}
		if old, err := os.ReadDir(parent); err == nil {
			for _, e := range old {
				if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
					os.RemoveAll(filepath.Join(parent, e.Name()))
				}
			}
		}
		dir, err := os.MkdirTemp(parent, "build-*")
		if err != nil {
			bErr = err
			return
		}
		path = filepath.Join(dir, "agents-sandbox")
		cmd := exec.Command("go", "build", "-trimpath", "-o", path, "./cmd/agents-sandbox")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		bOut, bErr = cmd.CombinedOutput()
	})
	if bErr != nil {
		t.Fatalf("build agents-sandbox: %v\n%s", bErr, bOut)
	}
	return path
}

// moduleRoot is the repository root (two levels above this file).
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
