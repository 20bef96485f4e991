package testenv

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// outcome is what a requirement did to the test that called it.
type outcome struct {
	skipped, failed bool
	msg             string
}

// recorder stands in for the *testing.T handed to a requirement, so that a skip or failure the policy
// demands can be observed instead of ending the real test. Like the real one, Skipf and Fatalf stop the
// calling goroutine.
type recorder struct {
	testing.TB
	mu  sync.Mutex
	out outcome
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.mu.Lock()
	r.out = outcome{skipped: true, msg: fmt.Sprintf(format, args...)}
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.out = outcome{failed: true, msg: fmt.Sprintf(format, args...)}
	r.mu.Unlock()
	runtime.Goexit()
}

// observe runs f with a recorder on its own goroutine and reports what f did to it.
func observe(t *testing.T, f func(testing.TB)) outcome {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out
}

// fakeEngine serves handler on a unix socket in a short temp dir (socket paths are limited to ~108 bytes)
// and returns its DOCKER_HOST value.
func fakeEngine(t *testing.T, handler http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "testenv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(handler)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return "unix://" + sock
}

// engineAPI answers /_ping like Docker 20.10 and /images/{ref}/json for the refs in images.
func engineAPI(t *testing.T, images ...string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/_ping", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			t.Errorf("ping with method %s, want GET", r.Method)
		}
		w.Header().Set("Api-Version", "1.41")
		fmt.Fprint(w, "OK")
	})
	mux.HandleFunc("/images/", func(w http.ResponseWriter, r *http.Request) {
		ref, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/images/"), "/json")
		if !ok {
			http.NotFound(w, r)
			return
		}
		for _, img := range images {
			if img == ref {
				fmt.Fprintf(w, `{"Id":"sha256:0","RepoTags":[%q]}`, ref)
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"message":"No such image: %s"}`, ref)
	})
	return mux
}

func testEnv(dockerHost string) env {
	return env{dockerHost: dockerHost, timeout: 2 * time.Second, lookPath: func(string) (string, error) { return "/usr/bin/git", nil }}
}

func TestRequireDockerAnsweringEngine(t *testing.T) {
	t.Parallel()
	host := fakeEngine(t, engineAPI(t))
	for _, ci := range []bool{false, true} {
		e := testEnv(host)
		e.ci = ci
		if got := observe(t, func(tb testing.TB) { requireDocker(tb, e) }); got != (outcome{}) {
			t.Errorf("CI=%v: answering engine gave %+v, want the test to go on", ci, got)
		}
	}
}

func TestRequireDockerNoEngine(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "testenv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	noSocket := "unix://" + filepath.Join(dir, "missing.sock")

	// A socket that accepts but never answers: the ping must give up after the timeout.
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	silent := fakeEngine(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	// Something answers, but it is not a Docker engine.
	wrong := fakeEngine(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "teapot", http.StatusTeapot)
	}))
	// Some other HTTP server answers 200 on every path.
	webServer := fakeEngine(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "<html>hello</html>")
	}))

	tests := []struct {
		name, host string
		ci         bool
		want       outcome
		wantIn     []string
	}{
		{"missing socket", noSocket, false, outcome{skipped: true}, []string{noSocket, "($DOCKER_HOST)", "run .ci/run or start dockerd"}},
		{"missing socket in CI", noSocket, true, outcome{failed: true}, []string{noSocket, "run .ci/run or start dockerd", "CI is true"}},
		{"silent engine", silent, false, outcome{skipped: true}, []string{"no answer in time"}},
		{"not an engine", wrong, false, outcome{skipped: true}, []string{"status 418"}},
		{"not an engine in CI", wrong, true, outcome{failed: true}, []string{"status 418"}},
		{"web server", webServer, false, outcome{skipped: true}, []string{"status 200", "hello"}},
		{"unsupported scheme", "ssh://me@host", false, outcome{skipped: true}, []string{`scheme "ssh"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := testEnv(tt.host)
			e.ci = tt.ci
			e.timeout = 300 * time.Millisecond
			start := time.Now()
			got := observe(t, func(tb testing.TB) { requireDocker(tb, e) })
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("took %v, want the timeout (%v) to bound it", elapsed, e.timeout)
			}
			if got.skipped != tt.want.skipped || got.failed != tt.want.failed {
				t.Fatalf("got skipped=%v failed=%v (%q), want skipped=%v failed=%v",
					got.skipped, got.failed, got.msg, tt.want.skipped, tt.want.failed)
			}
			if !strings.HasPrefix(got.msg, "no Docker engine answers at ") {
				t.Errorf("message %q does not start with %q", got.msg, "no Docker engine answers at ")
			}
			for _, s := range tt.wantIn {
				if !strings.Contains(got.msg, s) {
					t.Errorf("message %q lacks %q", got.msg, s)
				}
			}
		})
	}
}

func TestRequireDockerShortSkipsWithoutPinging(t *testing.T) {
	t.Parallel()
	pinged := make(chan struct{}, 1)
	host := fakeEngine(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pinged <- struct{}{}
		fmt.Fprint(w, "OK")
	}))
	for _, ci := range []bool{false, true} {
		e := testEnv(host)
		e.short, e.ci = true, ci
		got := observe(t, func(tb testing.TB) { requireDocker(tb, e) })
		if !got.skipped || !strings.Contains(got.msg, "-short") {
			t.Errorf("CI=%v -short: got %+v, want a skip that names -short", ci, got)
		}
	}
	select {
	case <-pinged:
		t.Error("-short still pinged the engine")
	default:
	}
}

func TestRequireImage(t *testing.T) {
	t.Parallel()
	host := fakeEngine(t, engineAPI(t, BaseImageRef))
	e := testEnv(host)

	var ref string
	if got := observe(t, func(tb testing.TB) { ref = requireImage(tb, e, BaseImageRef) }); got != (outcome{}) {
		t.Fatalf("present image: got %+v, want the test to go on", got)
	}
	if ref != BaseImageRef {
		t.Errorf("requireImage returned %q, want %q", ref, BaseImageRef)
	}

	// Missing images fail the test, CI or not, and say how to make them.
	got := observe(t, func(tb testing.TB) { requireImage(tb, e, BusyboxImageRef) })
	if !got.failed {
		t.Fatalf("missing image: got %+v, want a failure", got)
	}
	for _, s := range []string{BusyboxImageRef, "testdata/fixtures/base-images.sh"} {
		if !strings.Contains(got.msg, s) {
			t.Errorf("message %q lacks %q", got.msg, s)
		}
	}
}

func TestNewEngine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		host     string
		wantBase string
		wantErr  bool
	}{
		{"", "http://docker", false},
		{"unix:///var/run/docker.sock", "http://docker", false},
		{"tcp://127.0.0.1:2375", "http://127.0.0.1:2375", false},
		{"tcp://", "", true},
		{"unix://", "", true},
		{"npipe:////./pipe/docker_engine", "", true},
		{"::not a url", "", true},
	}
	for _, tt := range tests {
		eng, err := newEngine(tt.host)
		if (err != nil) != tt.wantErr {
			t.Errorf("newEngine(%q) error = %v, want error %v", tt.host, err, tt.wantErr)
			continue
		}
		if err == nil && eng.base != tt.wantBase {
			t.Errorf("newEngine(%q).base = %q, want %q", tt.host, eng.base, tt.wantBase)
		}
	}
}

func TestRequireDockerOverTCP(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(engineAPI(t))
	t.Cleanup(srv.Close)
	e := testEnv("tcp://" + srv.Listener.Addr().String())
	if got := observe(t, func(tb testing.TB) { requireDocker(tb, e) }); got != (outcome{}) {
		t.Errorf("engine on tcp loopback: got %+v, want the test to go on", got)
	}
}

func TestRequireGit(t *testing.T) {
	t.Parallel()
	absent := func(string) (string, error) { return "", errors.New(`exec: "git": executable file not found in $PATH`) }
	for _, ci := range []bool{false, true} {
		e := testEnv("")
		e.ci, e.lookPath = ci, absent
		got := observe(t, func(tb testing.TB) { requireGit(tb, e) })
		if got.skipped == ci || got.failed != ci || !strings.Contains(got.msg, "git is not installed") {
			t.Errorf("CI=%v, no git: got %+v, want skipped=%v failed=%v", ci, got, !ci, ci)
		}
	}
	if got := observe(t, func(tb testing.TB) { requireGit(tb, testEnv("")) }); got != (outcome{}) {
		t.Errorf("git present: got %+v, want the test to go on", got)
	}
}

func TestInCI(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"true": true, "1": true, "TRUE": true, "": false, "false": false, "0": false, "yes": false} {
		if got := inCI(v); got != want {
			t.Errorf("inCI(%q) = %v, want %v", v, got, want)
		}
	}
}

// The real thing: this machine's engine and fixture images, when present (always in CI).
func TestRealEngine(t *testing.T) {
	RequireDocker(t)
	if got := BaseImage(t); got != "debian:bookworm-slim" {
		t.Errorf("BaseImage = %q", got)
	}
	if got := BusyboxImage(t); got != "agents-sandbox-test/busybox:latest" {
		t.Errorf("BusyboxImage = %q", got)
	}
}

func TestRealGit(t *testing.T) {
	RequireGit(t)
}
