package docker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// These need no engine: they point the driver at addresses where none is.

func TestNewWithoutEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "")
	t.Setenv("DOCKER_API_VERSION", "")
	listener := filepath.Join(t.TempDir(), "not-a-socket")
	if err := os.WriteFile(listener, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host, hint string
	}{
		{"unix://" + filepath.Join(t.TempDir(), "missing.sock"), "start dockerd"},
		{"unix://" + listener, "start dockerd"},
		{"tcp://127.0.0.1:1", "check DOCKER_HOST"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := New(ctx, Options{Host: tc.host})
		cancel()
		if !errors.Is(err, sandbox.ErrRuntimeUnavailable) {
			t.Errorf("New(%s): err = %v, want ErrRuntimeUnavailable", tc.host, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.hint) || !strings.Contains(err.Error(), strings.TrimPrefix(tc.host, "unix://")) {
			t.Errorf("New(%s): error %q should name the host and say %q", tc.host, err, tc.hint)
		}
	}
}

func TestNewRejectsUnknownBuilder(t *testing.T) {
	_, err := New(context.Background(), Options{Builder: "kaniko"})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("err = %v, want ErrInvalid", err)
	}
}

func TestUnavailableHintPermission(t *testing.T) {
	d := &Driver{}
	var err error
	d.cli, err = client.New(client.WithHost("unix:///var/run/docker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	hint := d.unavailableHint(os.ErrPermission)
	if !strings.Contains(hint, "docker group") {
		t.Errorf("hint for permission denied = %q, want the docker group", hint)
	}
}
