package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// lines collects progress lines safely.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, line)
}

func (l *lines) contains(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.all {
		if strings.Contains(line, sub) {
			return true
		}
	}
	return false
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// imageRef is an image reference unique to this run.
func (s *suite) imageRef(what string) string {
	return "agents-sandbox-test/runtimetest:" + s.runID + "-" + what
}

// build builds a Dockerfile (the only file of the context) and removes the
// image when t ends.
func (s *suite) build(t *testing.T, tag, dockerfile string, labels map[string]string, progress *lines) (sandbox.Image, error) {
	t.Helper()
	ctx := makeTar(t, []tarEntry{{name: "Dockerfile", mode: 0o644, body: dockerfile}})
	img, err := s.rt.BuildImage(s.ctx(t), sandbox.BuildRequest{
		Context:        ctx,
		DockerfilePath: "Dockerfile",
		Tags:           []string{tag},
		Labels:         s.with(labels),
	}, progress.add)
	if err == nil {
		t.Cleanup(func() {
			cctx, cancel := cleanupCtx()
			defer cancel()
			if err := s.rt.RemoveImage(cctx, img.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("cleanup: RemoveImage %s: %v", tag, err)
			}
		})
	}
	return img, err
}

func (s *suite) testBuild(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		t.Parallel()
		ctx := s.ctx(t)
		tag := s.imageRef("ok")
		marker := "build-marker-" + s.runID
		var progress lines
		df := fmt.Sprintf("FROM %s\nRUN echo %s-$((6*7))\nUSER 65534\n", s.opts.Image, marker)
		img, err := s.build(t, tag, df, map[string]string{"org.agents-sandbox.test-role": "build"}, &progress)
		if err != nil {
			t.Fatalf("BuildImage: %v\nprogress:\n%s", err, progress.String())
		}
		t.Logf("progress:\n%s", progress.String())
		if !progress.contains(marker + "-42") {
			t.Errorf("progress lacks the RUN output %q:\n%s", marker+"-42", progress.String())
		}
		if !strings.HasPrefix(img.ID, "sha256:") || !contains(img.Tags, tag) {
			t.Errorf("BuildImage = id %q tags %v; want a sha256 ID tagged %s", img.ID, img.Tags, tag)
		}
		if img.Labels[LabelRun] != s.runID || img.Labels["org.agents-sandbox.test-role"] != "build" || img.User != "65534" {
			t.Errorf("BuildImage labels %v user %q", img.Labels, img.User)
		}
		got, err := s.rt.InspectImage(ctx, tag)
		if err != nil || got.ID != img.ID {
			t.Errorf("InspectImage(%s) = %q, %v; want %q", tag, got.ID, err, img.ID)
		}
		list, err := s.rt.ListImages(ctx, map[string]string{LabelRun: s.runID, "org.agents-sandbox.test-role": "build"})
		if err != nil || len(list) != 1 || list[0].ID != img.ID {
			t.Errorf("ListImages by label = %+v, %v; want only %s", list, err, img.ID)
		}
		vm := s.startedVM(t, sandbox.VMSpec{Name: s.name("built"), Image: tag})
		if out, _, code := s.exec(t, vm.Name, sandbox.ExecRequest{Cmd: []string{"id", "-u"}}); code != 0 || out != "65534\n" {
			t.Errorf("a VM from the built image runs as %q (exit %d), want the image's USER 65534", out, code)
		}
		if err := s.rt.RemoveImage(ctx, tag); !errors.Is(err, sandbox.ErrConflict) {
			t.Errorf("RemoveImage while a VM uses it: err = %v, want ErrConflict", err)
		}
	})

	t.Run("Failing", func(t *testing.T) {
		t.Parallel()
		ctx := s.ctx(t)
		tag := s.imageRef("fail")
		var progress lines
		df := fmt.Sprintf("FROM %s\nRUN echo fail-out-$((6*7)) && false\n", s.opts.Image)
		_, err := s.build(t, tag, df, nil, &progress)
		if !errors.Is(err, sandbox.ErrBuildFailed) {
			t.Fatalf("BuildImage of RUN false: err = %v, want ErrBuildFailed\nprogress:\n%s", err, progress.String())
		}
		msg := err.Error()
		t.Logf("the failure as reported:\n%s", msg)
		if !strings.Contains(msg, "RUN echo fail-out-$((6*7)) && false") {
			t.Errorf("error does not quote the failing step:\n%s", msg)
		}
		if !strings.Contains(msg, "fail-out-42") {
			t.Errorf("error does not quote the step's output:\n%s", msg)
		}
		if !progress.contains("fail-out-42") {
			t.Errorf("progress lacks the failing step's output:\n%s", progress.String())
		}
		if _, err := s.rt.InspectImage(ctx, tag); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("InspectImage after a failed build: err = %v, want ErrNotFound", err)
		}
	})

	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		s.testBuildCancel(t)
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		ctx := s.ctx(t)
		if _, err := s.rt.InspectImage(ctx, s.imageRef("missing")); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("InspectImage of a missing image: err = %v, want ErrNotFound", err)
		}
		if err := s.rt.RemoveImage(ctx, s.imageRef("missing")); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("RemoveImage of a missing image: err = %v, want ErrNotFound", err)
		}
	})
}

func (s *suite) testPruneBuildCache(t *testing.T) {
	ctx := s.ctx(t)
	tag := s.imageRef("prune")
	role := map[string]string{"org.agents-sandbox.test-role": "prune"}
	var progress lines
	first, err := s.build(t, tag, fmt.Sprintf("FROM %s\nRUN echo first-%s > /f\n", s.opts.Image, s.runID), role, &progress)
	if err != nil {
		t.Fatalf("BuildImage: %v", err)
	}
	// Building the tag again leaves the first image dangling, with our labels.
	second, err := s.build(t, tag, fmt.Sprintf("FROM %s\nRUN echo second-%s > /f\n", s.opts.Image, s.runID), role, &progress)
	if err != nil {
		t.Fatalf("BuildImage: %v", err)
	}
	if first.ID == second.ID {
		t.Fatalf("both builds gave %s", first.ID)
	}
	freed, err := s.rt.PruneBuildCache(ctx, s.with(role))
	if err != nil {
		t.Fatalf("PruneBuildCache: %v", err)
	}
	if freed <= 0 {
		t.Errorf("PruneBuildCache freed %d bytes, want > 0", freed)
	}
	if _, err := s.rt.InspectImage(ctx, first.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the dangling image survived the prune: err = %v", err)
	}
	if _, err := s.rt.InspectImage(ctx, tag); err != nil {
		t.Errorf("the tagged image did not survive the prune: %v", err)
	}
}

func (s *suite) testBuildCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(s.ctx(t))
	defer cancel()
	tag := s.imageRef("cancel")
	df := fmt.Sprintf("FROM %s\nRUN echo cancel-$((6*7)) && sleep 1000\n", s.opts.Image)
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := s.rt.BuildImage(ctx, sandbox.BuildRequest{
			Context: makeTar(t, []tarEntry{{name: "Dockerfile", mode: 0o644, body: df}}), DockerfilePath: "Dockerfile",
			Tags: []string{tag}, Labels: s.labels,
		}, func(line string) {
			if strings.Contains(line, "cancel-42") {
				once.Do(func() { close(started) })
			}
		})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("BuildImage returned before it was cancelled: %v", err)
	case <-ctx.Done():
		t.Fatal("the build's RUN step never started")
	}
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled BuildImage: err = %v, want context.Canceled", err)
		}
		t.Logf("cancelled BuildImage returned after %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled BuildImage did not return within 10s")
	}
}
