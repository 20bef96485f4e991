package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// inProcessRSS says how PeakRSSMiB of an in-process row was read.
const inProcessRSS = "VmHWM of the row's own child process (Manager in-process, plus the harness)"

// docker runs the docker CLI and returns its stdout.
func dockerCLI(ctx context.Context, args ...string) (string, error) {
	return runCmd(ctx, "docker", args...)
}

// baselineContainer starts a long-running container equivalent to the
// project VM (same image, the checkout at /workspace, a home volume, no
// network, same capabilities) and returns its name and a function removing
// it and its volume.
func (e *Env) baselineContainer(ctx context.Context, what string) (string, func(), error) {
	name, vol := e.baselineName(what), e.baselineName(what+"-home")
	remove := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = dockerCLI(rctx, "rm", "-f", name)
		_, _ = dockerCLI(rctx, "volume", "rm", "-f", vol)
	}
	if _, err := dockerCLI(ctx, "volume", "create", "--label", benchLabel+"="+e.RunID, vol); err != nil {
		return "", remove, err
	}
	args := append([]string{"run", "-d", "--name", name}, e.baselineArgs()...)
	args = append(args, "-v", e.Checkout+":/workspace", "-v", vol+":/home/dev", "-w", "/workspace", e.ImageID, "sleep", "infinity")
	if _, err := dockerCLI(ctx, args...); err != nil {
		return "", remove, err
	}
	return name, remove, nil
}

// stepTimes collects CreateResult.TimingsMS over runs.
type stepTimes map[string][]float64

func (s *stepTimes) add(t map[string]int64) {
	if *s == nil {
		*s = stepTimes{}
	}
	for k, v := range t {
		(*s)[k] = append((*s)[k], float64(v))
	}
}

// note is "Create's own timings, median ms: image 3, total 20, …".
func (s stepTimes) note() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, num(summarize(s[k]).Median)))
	}
	return "Create's own step timings (CreateResult.timings_ms), median ms: " + strings.Join(parts, ", ")
}

// timed runs fn and returns its duration in milliseconds.
func timed(fn func() error) (float64, error) {
	t := time.Now()
	err := fn()
	return ms(time.Since(t)), err
}

// ourCLI runs our binary with args (stdout discarded) and returns its wall
// time and ru_maxrss.
func (e *Env) ourCLI(ctx context.Context, args ...string) (float64, int64, error) {
	cmd := exec.CommandContext(ctx, e.Bin, args...)
	cmd.Env = e.environ()
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	t := time.Now()
	err := cmd.Run()
	d := ms(time.Since(t))
	if err != nil {
		return d, 0, fmt.Errorf("agents-sandbox %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return d, rusageMaxRSS(cmd.ProcessState), nil
}

// Row 1: create with everything cached and the VM running.
func runCreateFast(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := m.Create(ctx, p, sandbox.CreateOptions{}); err != nil {
		return nil, err
	}
	c, remove, err := e.baselineContainer(ctx, "fast")
	defer remove()
	if err != nil {
		return nil, err
	}
	baseline := func() error {
		if _, err := dockerCLI(ctx, "start", c); err != nil {
			return err
		}
		_, err := dockerCLI(ctx, "exec", c, "true")
		return err
	}
	var steps stepTimes
	ours := func() error {
		res, err := m.Create(ctx, p, sandbox.CreateOptions{})
		if err == nil && res.Action != sandbox.VMReused {
			err = fmt.Errorf("create took the %s path, not the fast path", res.Action)
		}
		steps.add(res.TimingsMS)
		return err
	}
	o, b, err := interleave(f.nFast, 1, ours, baseline)
	if err != nil {
		return nil, err
	}
	r := pair("1", "create, image cached and VM running (attach fast path)", "Manager.Create in-process", "docker start + docker exec true on a running equivalent container", "ms", "lower", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS
	r.Notes = append(r.Notes, steps.note())

	var peak int64
	oursCLI := func() error {
		_, rss, err := e.ourCLI(ctx, "create", "-C", e.Checkout, "--json")
		peak = max(peak, rss)
		return err
	}
	o, b, err = interleave(f.nFast, 1, oursCLI, baseline)
	if err != nil {
		return nil, err
	}
	r2 := pair("1b", "create, VM running, as a CLI process", "`agents-sandbox create` process", "docker start + docker exec true", "ms", "lower", o, b)
	r2.PeakRSSMiB, r2.RSSSource = mib(peak), "largest ru_maxrss of the agents-sandbox processes (wait4 rusage)"
	return []Row{r, r2}, nil
}

// interleave runs ours and baseline n times each, alternating, after warm
// untimed warm-up runs of each, and returns their durations in ms.
func interleave(n, warm int, ours, baseline func() error) ([]float64, []float64, error) {
	for i := 0; i < warm; i++ {
		if err := ours(); err != nil {
			return nil, nil, fmt.Errorf("warm-up (ours): %w", err)
		}
		if err := baseline(); err != nil {
			return nil, nil, fmt.Errorf("warm-up (baseline): %w", err)
		}
	}
	var o, b []float64
	for i := 0; i < n; i++ {
		d, err := timed(ours)
		if err != nil {
			return nil, nil, fmt.Errorf("run %d (ours): %w", i, err)
		}
		o = append(o, d)
		d, err = timed(baseline)
		if err != nil {
			return nil, nil, fmt.Errorf("run %d (baseline): %w", i, err)
		}
		b = append(b, d)
	}
	return o, b, nil
}

// Row 2: create with the image cached but no VM and no home volume.
func runCreateCold(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	name, vol := e.baselineName("cold"), e.baselineName("cold-home")
	removeBaseline := func() error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := dockerCLI(rctx, "rm", "-f", name); err != nil {
			return err
		}
		_, err := dockerCLI(rctx, "volume", "rm", "-f", vol)
		return err
	}
	defer removeBaseline()
	var o, b []float64
	var steps stepTimes
	for i := -1; i < f.nHeavy; i++ { // i == -1: warm-up
		if _, err := m.Remove(ctx, p, true); err != nil {
			return nil, fmt.Errorf("remove VM and volume before run %d: %w", i, err)
		}
		var res sandbox.CreateResult
		d, err := timed(func() error {
			var err error
			res, err = m.Create(ctx, p, sandbox.CreateOptions{})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("run %d (ours): %w", i, err)
		}
		if res.Action != sandbox.VMCreatedA || !res.VolumeCreated || res.ImageBuilt {
			return nil, fmt.Errorf("run %d (ours): action %s, volume created %v, image built %v; want a new VM and volume from a cached image", i, res.Action, res.VolumeCreated, res.ImageBuilt)
		}
		if i >= 0 {
			o = append(o, d)
			steps.add(res.TimingsMS)
		}
		if err := removeBaseline(); err != nil {
			return nil, err
		}
		d, err = timed(func() error {
			if _, err := dockerCLI(ctx, "volume", "create", "--label", benchLabel+"="+e.RunID, vol); err != nil {
				return err
			}
			args := append([]string{"run", "-d", "--name", name}, e.baselineArgs()...)
			args = append(args, "-v", e.Checkout+":/workspace", "-v", vol+":/home/dev", "-w", "/workspace", e.ImageID, "sleep", "infinity")
			if _, err := dockerCLI(ctx, args...); err != nil {
				return err
			}
			_, err := dockerCLI(ctx, "exec", name, "true")
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("run %d (baseline): %w", i, err)
		}
		if i >= 0 {
			b = append(b, d)
		}
	}
	r := pair("2", "create, image cached, no VM and no volume", "Manager.Create in-process (volume, VM, init copy, start, ready, provision)", "docker volume create + docker run -d + docker exec true", "ms", "lower", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS
	r.Notes = append(r.Notes, steps.note())
	return []Row{r}, nil
}

// Row 3: exec true in a running VM.
func runExec(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := m.Create(ctx, p, sandbox.CreateOptions{}); err != nil {
		return nil, err
	}
	c, remove, err := e.baselineContainer(ctx, "exec")
	defer remove()
	if err != nil {
		return nil, err
	}
	ours := func() error {
		res, err := m.Exec(ctx, p, sandbox.ExecOptions{Cmd: []string{"true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr.Text)
		}
		return err
	}
	baseline := func() error {
		_, err := dockerCLI(ctx, "exec", c, "true")
		return err
	}
	o, b, err := interleave(f.nFast, 1, ours, baseline)
	if err != nil {
		return nil, err
	}
	r := pair("3", "exec `true` in a running VM", "Manager.Exec in-process (through the in-VM exec wrapper)", "docker exec true", "ms", "lower", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS

	var peak int64
	oursCLI := func() error {
		_, rss, err := e.ourCLI(ctx, "exec", "-C", e.Checkout, "--", "true")
		peak = max(peak, rss)
		return err
	}
	o, b, err = interleave(f.nFast, 1, oursCLI, baseline)
	if err != nil {
		return nil, err
	}
	r2 := pair("3b", "exec `true`, as a CLI process", "`agents-sandbox exec -- true` process", "docker exec true", "ms", "lower", o, b)
	r2.PeakRSSMiB, r2.RSSSource = mib(peak), "largest ru_maxrss of the agents-sandbox processes (wait4 rusage)"
	return []Row{r, r2}, nil
}

// countWriter counts the bytes written to it.
type countWriter struct{ n atomic.Int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// Row 4: exec streaming f.stream bytes of output.
func runStream(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := m.Create(ctx, p, sandbox.CreateOptions{}); err != nil {
		return nil, err
	}
	c, remove, err := e.baselineContainer(ctx, "stream")
	defer remove()
	if err != nil {
		return nil, err
	}
	const blob = "/tmp/asb-bench-blob"
	mk := fmt.Sprintf("head -c %d /dev/urandom > %s", f.stream, blob)
	if res, err := m.Exec(ctx, p, sandbox.ExecOptions{Cmd: []string{"sh", "-c", mk}}); err != nil || res.ExitCode != 0 {
		return nil, fmt.Errorf("make the blob in the VM: exit %d: %v %s", res.ExitCode, err, res.Stderr.Text)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = m.Exec(rctx, p, sandbox.ExecOptions{Cmd: []string{"rm", "-f", blob}})
	}()
	if _, err := dockerCLI(ctx, "exec", c, "sh", "-c", mk); err != nil {
		return nil, fmt.Errorf("make the blob in the baseline container: %w", err)
	}
	var o, b []float64
	for i := -1; i < f.nStream; i++ {
		var w countWriter
		t := time.Now()
		res, err := m.Exec(ctx, p, sandbox.ExecOptions{Cmd: []string{"cat", blob}, Stdout: &w})
		d := time.Since(t)
		if err != nil || res.ExitCode != 0 {
			return nil, fmt.Errorf("run %d (ours): exit %d: %v %s", i, res.ExitCode, err, res.Stderr.Text)
		}
		if w.n.Load() != f.stream {
			return nil, fmt.Errorf("run %d (ours): got %d bytes, want %d", i, w.n.Load(), f.stream)
		}
		if i >= 0 {
			o = append(o, mbps(f.stream, d))
		}

		var bw countWriter
		cmd := exec.CommandContext(ctx, "docker", "exec", c, "cat", blob)
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &bw, &stderr
		t = time.Now()
		err = cmd.Run()
		d = time.Since(t)
		if err != nil {
			return nil, fmt.Errorf("run %d (baseline): %w: %s", i, err, stderr.String())
		}
		if bw.n.Load() != f.stream {
			return nil, fmt.Errorf("run %d (baseline): got %d bytes, want %d", i, bw.n.Load(), f.stream)
		}
		if i >= 0 {
			b = append(b, mbps(f.stream, d))
		}
	}
	r := pair("4", fmt.Sprintf("exec streaming %d MiB of output", f.stream>>20), "Manager.Exec in-process, `cat` of a file, stdout to an io.Writer", "docker exec cat of the same bytes, stdout read through a pipe", "MB/s", "higher", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS
	return []Row{r}, nil
}

// Row 5, workspace none.
func runTaskNone(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	ours := func() error { return spawnTrue(ctx, m, p, sandbox.WorkspaceNone) }
	baseline := func() error {
		args := append([]string{"run", "--rm"}, e.baselineArgs()...)
		_, err := dockerCLI(ctx, append(args, e.ImageID, "true")...)
		return err
	}
	o, b, err := interleave(f.nHeavy, 1, ours, baseline)
	if err != nil {
		return nil, err
	}
	r := pair("5a", "spawn_task `true`, workspace none", "Manager.SpawnTask in-process", "docker run --rm true", "ms", "lower", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS
	return []Row{r}, nil
}

func spawnTrue(ctx context.Context, m *sandbox.Manager, p *sandbox.Project, ws sandbox.WorkspaceMode) error {
	res, err := m.SpawnTask(ctx, p, sandbox.TaskOptions{Cmd: []string{"true"}, Workspace: ws})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("task exit %d: %s", res.ExitCode, res.Stderr.Text)
	}
	if err == nil && ws == sandbox.WorkspaceCopy && len(res.Changed) != 0 {
		err = fmt.Errorf("task changed %d files, want none", len(res.Changed))
	}
	return err
}

// Row 5, workspace copy of the checkout.
func runTaskCopy(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	ours := func() error { return spawnTrue(ctx, m, p, sandbox.WorkspaceCopy) }
	seq := 0
	baseline := func() error {
		seq++
		name := e.baselineName("copy-" + strconv.Itoa(seq))
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = dockerCLI(rctx, "rm", "-f", name)
		}()
		args := append([]string{"create", "--name", name}, e.baselineArgs()...)
		if _, err := dockerCLI(ctx, append(args, e.ImageID, "true")...); err != nil {
			return err
		}
		if _, err := dockerCLI(ctx, "cp", e.Checkout+"/.", name+":/workspace"); err != nil {
			return err
		}
		if _, err := dockerCLI(ctx, "start", "-a", name); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, "docker", "cp", name+":/workspace", "-")
		var w countWriter
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &w, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("docker cp out: %w: %s", err, stderr.String())
		}
		_, err := dockerCLI(ctx, "rm", name)
		return err
	}
	o, b, err := interleave(f.nCopy, 0, ours, baseline)
	if err != nil {
		return nil, err
	}
	r := pair("5b", fmt.Sprintf("spawn_task `true`, workspace copy of a %d-file checkout", e.Files), "Manager.SpawnTask in-process (snapshot, copy in, run, copy out, diff)", "docker create + docker cp in + docker start -a + docker cp out + docker rm", "ms", "lower", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS
	return []Row{r}, nil
}

// Row 6: f.conc task sandboxes at once.
func runTaskConcurrent(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	m, _, p, err := e.manager(ctx)
	if err != nil {
		return nil, err
	}
	all := func(one func() error) func() error {
		return func() error {
			var wg sync.WaitGroup
			errs := make([]error, f.conc)
			for i := range f.conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = one()
				}()
			}
			wg.Wait()
			return errors.Join(errs...)
		}
	}
	ours := all(func() error { return spawnTrue(ctx, m, p, sandbox.WorkspaceNone) })
	baseline := all(func() error {
		args := append([]string{"run", "--rm"}, e.baselineArgs()...)
		_, err := dockerCLI(ctx, append(args, e.ImageID, "true")...)
		return err
	})
	o, b, err := interleave(f.nConc, 0, ours, baseline)
	if err != nil {
		return nil, err
	}
	r := pair("6", fmt.Sprintf("%d task sandboxes spawned concurrently (workspace none), wall time", f.conc), fmt.Sprintf("%d goroutines calling Manager.SpawnTask", f.conc), fmt.Sprintf("%d concurrent docker run --rm true", f.conc), "ms", "lower", o, b)
	r.PeakRSSMiB, r.RSSSource = selfPeakMiB(), inProcessRSS
	return []Row{r}, nil
}
