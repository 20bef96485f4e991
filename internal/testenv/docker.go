package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

const defaultDockerHost = "unix:///var/run/docker.sock"

// RequireDocker skips t when -short is set or when no Docker engine answers a ping within 3 s at
// $DOCKER_HOST (default unix:///var/run/docker.sock). When CI is true a missing engine fails t instead.
func RequireDocker(t testing.TB) {
	t.Helper()
	requireDocker(t, currentEnv())
}

// BaseImage returns the Debian base image the runtime builds on ("debian:bookworm-slim") after checking that
// the engine has it. A missing image fails t: the fixture script makes it.
func BaseImage(t testing.TB) string {
	t.Helper()
	return requireImage(t, currentEnv(), BaseImageRef)
}

// BusyboxImage returns "agents-sandbox-test/busybox:latest", a tiny image for tests that only need a
// container to exist, after checking that the engine has it. A missing image fails t.
func BusyboxImage(t testing.TB) string {
	t.Helper()
	return requireImage(t, currentEnv(), BusyboxImageRef)
}

func requireDocker(t testing.TB, e env) *engine {
	t.Helper()
	if e.short {
		t.Skipf("needs a Docker engine; skipped in -short mode")
	}
	eng, err := newEngine(e.dockerHost)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		defer cancel()
		err = eng.ping(ctx)
	}
	if err != nil {
		e.missing(t, fmt.Sprintf("no Docker engine answers at %s: %v; run .ci/run or start dockerd",
			describeHost(e.dockerHost), err))
	}
	return eng
}

func requireImage(t testing.TB, e env, ref string) string {
	t.Helper()
	eng := requireDocker(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := eng.imageExists(ctx, ref)
	if err != nil {
		t.Fatalf("inspect image %s: %v", ref, err)
	}
	if !ok {
		t.Fatalf("image %s is missing from the Docker engine at %s; %s", ref, describeHost(e.dockerHost), fixHint)
	}
	return ref
}

// describeHost names the engine address as the skip message shows it.
func describeHost(dockerHost string) string {
	if dockerHost == "" {
		return defaultDockerHost + " ($DOCKER_HOST is unset)"
	}
	return dockerHost + " ($DOCKER_HOST)"
}

// engine is a minimal Docker Engine API client: enough to ping and to inspect an image.
type engine struct {
	client *http.Client
	base   string // "http://docker" for a unix socket, "http://host:port" for tcp
}

// newEngine makes a client for a DOCKER_HOST value ("" means the default unix socket).
func newEngine(dockerHost string) (*engine, error) {
	if dockerHost == "" {
		dockerHost = defaultDockerHost
	}
	u, err := url.Parse(dockerHost)
	if err != nil {
		return nil, fmt.Errorf("parse DOCKER_HOST %q: %w", dockerHost, err)
	}
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque
		}
		if path == "" {
			return nil, fmt.Errorf("DOCKER_HOST %q names no socket path", dockerHost)
		}
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		return &engine{client: &http.Client{Transport: tr}, base: "http://docker"}, nil
	case "tcp", "http":
		if u.Host == "" {
			return nil, fmt.Errorf("DOCKER_HOST %q names no host", dockerHost)
		}
		return &engine{client: &http.Client{Transport: tr}, base: "http://" + u.Host}, nil
	default:
		return nil, fmt.Errorf("DOCKER_HOST %q: scheme %q is not supported here (unix or tcp without TLS)", dockerHost, u.Scheme)
	}
}

// get sends GET path and returns the status code and up to 4 KiB of the body.
func (e *engine) get(ctx context.Context, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return resp.StatusCode, "", fmt.Errorf("read %s response: %w", path, err)
	}
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// ping is GET /_ping: the engine answers 200 "OK".
func (e *engine) ping(ctx context.Context) error {
	code, body, err := e.get(ctx, "/_ping")
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("ping: no answer in time: %w", err)
		}
		return fmt.Errorf("ping: %w", err)
	}
	if code != http.StatusOK || body != "OK" {
		return fmt.Errorf("ping: status %d, body %q", code, body)
	}
	return nil
}

// imageExists is GET /images/{ref}/json: 200 when the engine has the image, 404 when it does not.
func (e *engine) imageExists(ctx context.Context, ref string) (bool, error) {
	// The engine's route is /images/{name:.*}/json: a reference's slashes and colon go in as they are.
	code, body, err := e.get(ctx, "/images/"+ref+"/json")
	switch {
	case err != nil:
		return false, err
	case code == http.StatusOK:
		return true, nil
	case code == http.StatusNotFound:
		return false, nil
	default:
		return false, fmt.Errorf("status %d: %s", code, body)
	}
}
