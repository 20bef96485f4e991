// Package testenv tells tests what this machine offers (a Docker engine, the fixture base images, git)
// and skips or fails them accordingly.
//
// The policy, the same for every requirement:
//   - `go test -short` skips tests that need the Docker engine;
//   - a missing dependency skips the test with a message that says how to get it,
//     except when the environment variable CI is true: CI must always run them, so there it fails the test.
//
// The package talks to the engine with plain net/http (GET /_ping, GET /images/{ref}/json), so it pulls in
// no Docker SDK.
package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Fixture images made by testdata/fixtures/base-images.sh.
const (
	BaseImageRef    = "debian:bookworm-slim"
	BusyboxImageRef = "agents-sandbox-test/busybox:latest"
)

// pingTimeout bounds how long RequireDocker waits for the engine to answer.
const pingTimeout = 3 * time.Second

// fixHint is how to get the fixture images.
const fixHint = "run testdata/fixtures/base-images.sh (or `just fixtures`)"

// env is what the policy depends on, read from the process so tests can substitute it.
type env struct {
	short      bool
	ci         bool
	dockerHost string
	timeout    time.Duration
	lookPath   func(string) (string, error)
}

func currentEnv() env {
	return env{
		short:      testing.Short(),
		ci:         inCI(os.Getenv("CI")),
		dockerHost: os.Getenv("DOCKER_HOST"),
		timeout:    pingTimeout,
		lookPath:   exec.LookPath,
	}
}

// inCI reports whether the value of $CI says "this is CI" ("true", "1", "TRUE", …).
func inCI(v string) bool {
	b, err := strconv.ParseBool(v)
	return err == nil && b
}

// missing skips t with msg, or fails it when running in CI, where every dependency must be present.
func (e env) missing(t testing.TB, msg string) {
	t.Helper()
	if e.ci {
		t.Fatalf("%s (CI is true, so this fails instead of skipping)", msg)
	}
	t.Skipf("%s", msg)
}

// RequireGit skips t when no git executable is on PATH (fails it when CI is true).
func RequireGit(t testing.TB) {
	t.Helper()
	requireGit(t, currentEnv())
}

func requireGit(t testing.TB, e env) {
	t.Helper()
	if _, err := e.lookPath("git"); err != nil {
		e.missing(t, "git is not installed ("+err.Error()+"); run .ci/run or apt-get install git")
	}
}
