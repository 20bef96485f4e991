package docker_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
	"github.com/agents-sandbox/agents-sandbox/sandbox/runtimetest"
)

// newDriver connects to the test engine or skips (fails in CI) without one.
func newDriver(t *testing.T, opts docker.Options) *docker.Driver {
	t.Helper()
	testenv.RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	opts.Logger = zerolog.New(zerolog.NewTestWriter(t))
	d, err := docker.New(ctx, opts)
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func suiteOptions(t *testing.T) runtimetest.Options {
	return runtimetest.Options{
		Image:  testenv.BusyboxImage(t),
		Labels: map[string]string{"org.agents-sandbox.kind": "test", "org.agents-sandbox.test": t.Name()},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	d := newDriver(t, docker.Options{})
	runtimetest.Run(t, d, suiteOptions(t))
}

// TestBuildKit runs the build tests with BuildKit forced, which Docker 20.10
// does not use for API builds by default.
func TestBuildKit(t *testing.T) {
	t.Parallel()
	d := newDriver(t, docker.Options{Builder: docker.BuilderBuildKit})
	if !d.Capabilities().BuildKit {
		t.Skip("the engine cannot build with BuildKit")
	}
	runtimetest.RunBuild(t, d, suiteOptions(t))
}

// TestClassicBuilder runs the build tests with the classic builder forced,
// which newer engines do not use by default.
func TestClassicBuilder(t *testing.T) {
	t.Parallel()
	d := newDriver(t, docker.Options{Builder: docker.BuilderClassic})
	runtimetest.RunBuild(t, d, suiteOptions(t))
}
