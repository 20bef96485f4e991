// Command bench measures agents-sandbox's hot paths side by side with the
// plain Docker CLI doing the same work (issue 10) and prints one table:
// operation, ours, the baseline, the ratio and the peak RSS of our process.
//
// Each pair runs interleaved (ours, baseline, ours, baseline, …) in the same
// invocation so machine noise hits both sides alike; figures are medians (or
// p50/p99 for latency rows), never a single run. Results also go to
// bench/results.json. See bench/README.md for what each figure means.
//
// The parent process builds a static agents-sandbox binary, makes a
// temporary git checkout and configuration, creates the project VM once and
// then runs each group of rows in a child process of its own (this binary
// again, with -child), so that the peak RSS a group reports is its own. At
// the end it removes every container, volume and image the run made, found
// by labels: the checkout slug of the run's temporary checkout (our side)
// and org.agents-sandbox.bench=<run id> (the Docker CLI side).
//
// Usage (from the repository root): go run ./bench [flags]   (or: just bench)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

// flags are the command line. The defaults keep a whole run under about ten
// minutes on a 2-core machine.
type flags struct {
	nFast     int   // create fast path, exec true
	nHeavy    int   // create from cold, spawn_task none
	nCopy     int   // spawn_task copy
	nStream   int   // 256 MiB exec streams
	nConc     int   // rounds of concurrent task spawns
	conc      int   // tasks per round
	calls     int   // MCP / JSON-RPC calls
	requests  int   // proxy latency requests
	nTransfer int   // proxy transfers
	transfer  int64 // bytes per transfer
	stream    int64 // bytes per exec stream
	files     int   // files in the checkout
	conns     int   // concurrent proxy connections for the memory row
	groups    string
	bin       string
	out       string
	profile   string // directory for one CPU profile per group

	child   string // internal: run one group and print its rows as JSON
	envFile string // internal: the parent's Env
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&f.nFast, "n-fast", 101, "pairs for the fast rows (create on a running VM, exec true)")
	fs.IntVar(&f.nHeavy, "n-heavy", 11, "pairs for create from cold and spawn_task with workspace none")
	fs.IntVar(&f.nCopy, "n-copy", 5, "pairs for spawn_task with workspace copy")
	fs.IntVar(&f.nStream, "n-stream", 7, "pairs for the exec output stream")
	fs.IntVar(&f.nConc, "n-concurrent", 5, "pairs of concurrent-spawn rounds")
	fs.IntVar(&f.conc, "concurrency", 20, "task sandboxes per concurrent round")
	fs.IntVar(&f.calls, "calls", 1000, "MCP and JSON-RPC calls (each side)")
	fs.IntVar(&f.requests, "requests", 2000, "proxy latency requests (each side)")
	fs.IntVar(&f.nTransfer, "n-transfer", 5, "pairs of proxy transfers (download and upload)")
	fs.Int64Var(&f.transfer, "transfer-bytes", 1<<30, "bytes per proxy transfer")
	fs.Int64Var(&f.stream, "stream-bytes", 256<<20, "bytes per exec output stream")
	fs.IntVar(&f.files, "files", 10000, "files in the benchmark checkout")
	fs.IntVar(&f.conns, "conns", 100, "concurrent connections through the proxy for its memory row")
	fs.StringVar(&f.groups, "rows", strings.Join(groupNames(), ","), "comma-separated row groups to run")
	fs.StringVar(&f.bin, "bin", "", "a static agents-sandbox binary to use (default: build ./cmd/agents-sandbox with CGO_ENABLED=0)")
	fs.StringVar(&f.out, "out", filepath.Join("bench", "results.json"), "where to write the results")
	fs.StringVar(&f.profile, "cpuprofile", "", "write a CPU profile of each row group's child process to this directory (GROUP.pprof)")
	fs.StringVar(&f.child, "child", "", "internal: run one row group and print its rows as JSON")
	fs.StringVar(&f.envFile, "env", "", "internal: the parent's environment file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, n := range []int{f.nFast, f.nHeavy, f.nCopy, f.nStream, f.nConc, f.conc, f.calls, f.requests, f.nTransfer, f.conns} {
		if n < 1 {
			return nil, errors.New("every count must be at least 1")
		}
	}
	return f, nil
}

// group is a set of rows measured by one child process.
type group struct {
	name string
	desc string
	run  func(ctx context.Context, e *Env, f *flags) ([]Row, error)
}

func groups() []group {
	return []group{
		{"create-fast", "1: create with the VM running", runCreateFast},
		{"create-cold", "2: create with no VM or volume", runCreateCold},
		{"exec", "3: exec true", runExec},
		{"stream", "4: exec streaming output", runStream},
		{"task-none", "5: spawn_task, workspace none", runTaskNone},
		{"task-copy", "5: spawn_task, workspace copy", runTaskCopy},
		{"task-concurrent", "6: concurrent task sandboxes", runTaskConcurrent},
		{"mcp", "7: MCP tools/call over stdio", runMCP},
		{"rpc", "7: JSON-RPC over a unix socket", runRPC},
		{"proxy-latency", "8: proxy latency", runProxyLatency},
		{"proxy-transfer", "8: proxy throughput", runProxyTransfer},
		{"mem-mcp", "9: idle MCP server memory", runMemMCP},
		{"mem-proxy", "9: proxy memory under load", runMemProxy},
	}
}

func groupNames() []string {
	var out []string
	for _, g := range groups() {
		out = append(out, g.name)
	}
	return out
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.child != "" {
		err = child(ctx, f)
	} else {
		err = parent(ctx, f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// child runs one group and writes its rows as JSON to stdout.
func child(ctx context.Context, f *flags) error {
	e, err := loadEnv(f.envFile)
	if err != nil {
		return err
	}
	for _, g := range groups() {
		if g.name == f.child {
			if f.profile != "" {
				stop, err := startProfile(filepath.Join(f.profile, g.name+".pprof"))
				if err != nil {
					return err
				}
				defer stop()
			}
			rows, err := g.run(ctx, e, f)
			if err != nil {
				return fmt.Errorf("%s: %w", g.name, err)
			}
			return json.NewEncoder(os.Stdout).Encode(rows)
		}
	}
	return fmt.Errorf("unknown row group %q", f.child)
}

// startProfile starts a CPU profile written to path; the returned function
// stops it.
func startProfile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	fh, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(fh); err != nil {
		fh.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = fh.Close()
	}, nil
}

// Results is what bench/results.json holds.
type Results struct {
	RunID     string         `json:"run_id"`
	Started   time.Time      `json:"started"`
	Seconds   float64        `json:"seconds"`
	Machine   Machine        `json:"machine"`
	Flags     map[string]any `json:"flags"`
	Rows      []Row          `json:"rows"`
	Setup     []string       `json:"setup,omitempty"`
	GroupSecs map[string]int `json:"group_seconds"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs          int    `json:"cpus"`
	CPUModel      string `json:"cpu_model"`
	MemTotalGiB   string `json:"mem_total_gib"`
	Kernel        string `json:"kernel"`
	Docker        string `json:"docker"`
	DockerAPI     string `json:"docker_api"`
	StorageDriver string `json:"storage_driver"`
	Go            string `json:"go"`
}

func parent(ctx context.Context, f *flags) (err error) {
	start := time.Now()
	var setupLog []string
	say := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		setupLog = append(setupLog, line)
		fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Since(start).Round(time.Second), line)
	}
	want := map[string]bool{}
	for _, n := range strings.Split(f.groups, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	for n := range want {
		found := false
		for _, g := range groups() {
			found = found || g.name == n
		}
		if !found {
			return fmt.Errorf("-rows: unknown row group %q (have: %s)", n, strings.Join(groupNames(), ", "))
		}
	}

	e, err := setup(ctx, f, say)
	if e != nil {
		defer func() {
			if cerr := cleanup(e, say); cerr != nil {
				say("cleanup: %v", cerr)
				err = errors.Join(err, cerr)
			}
		}()
	}
	if err != nil {
		return err
	}
	machine := describeMachine(ctx)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var rows []Row
	secs := map[string]int{}
	failed := 0
	for _, g := range groups() {
		if !want[g.name] {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		say("%s (%s) …", g.name, g.desc)
		t0 := time.Now()
		args := append(append([]string(nil), os.Args[1:]...), "-child", g.name, "-env", filepath.Join(e.Root, "env.json"))
		cmd := exec.CommandContext(ctx, self, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		cmd.Env = os.Environ()
		runErr := cmd.Run()
		secs[g.name] = int(time.Since(t0).Seconds())
		var got []Row
		if runErr == nil {
			runErr = json.Unmarshal(out.Bytes(), &got)
		}
		if runErr != nil {
			failed++
			say("%s failed after %s: %v", g.name, time.Since(t0).Round(time.Second), runErr)
			rows = append(rows, Row{ID: "-", Operation: g.desc, Error: runErr.Error()})
			continue
		}
		for _, r := range got {
			say("  %-7s %-58s ours %s %s, baseline %s %s", r.ID, r.Operation, num(r.OursValue), r.Unit, num(r.BaseValue), r.Unit)
		}
		say("%s done in %s", g.name, time.Since(t0).Round(time.Second))
		rows = append(rows, got...)
	}

	res := Results{
		RunID: e.RunID, Started: start.UTC(), Seconds: time.Since(start).Seconds(), Machine: machine,
		Flags: map[string]any{
			"n_fast": f.nFast, "n_heavy": f.nHeavy, "n_copy": f.nCopy, "n_stream": f.nStream, "n_concurrent": f.nConc,
			"concurrency": f.conc, "calls": f.calls, "requests": f.requests, "n_transfer": f.nTransfer,
			"transfer_bytes": f.transfer, "stream_bytes": f.stream, "files": f.files, "conns": f.conns, "rows": f.groups,
		},
		Rows: rows, Setup: setupLog, GroupSecs: secs,
	}
	fmt.Printf("\nagents-sandbox benchmarks, run %s, %s; %d CPUs, %s GiB, Linux %s, Docker %s (API %s)\n\n",
		e.RunID, start.UTC().Format(time.RFC3339), machine.CPUs, machine.MemTotalGiB, machine.Kernel, machine.Docker, machine.DockerAPI)
	fmt.Print(table(rows))
	fmt.Printf("\nratio = ours / baseline; for ms lower is better, for MB/s higher. Whole run: %s.\n", time.Since(start).Round(time.Second))
	first := true
	for _, r := range rows {
		for _, n := range r.Notes {
			if first {
				fmt.Print("\nNotes:\n")
				first = false
			}
			fmt.Printf("- %s: %s\n", r.ID, n)
		}
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(f.out, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	say("results written to %s", f.out)
	if failed > 0 {
		return fmt.Errorf("%d row group(s) failed", failed)
	}
	return nil
}

// describeMachine reads the CPU count and model, memory, kernel and the
// Docker engine's version.
func describeMachine(ctx context.Context) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if kb := procField("/proc/meminfo", "MemTotal"); kb != "" {
		var n float64
		if _, err := fmt.Sscanf(kb, "%f", &n); err == nil {
			m.MemTotalGiB = fmt.Sprintf("%.1f", n/(1<<20))
		}
	}
	if d, err := docker.New(ctx, docker.Options{Logger: logger()}); err == nil {
		if info, err := d.Info(ctx); err == nil {
			m.Docker, m.DockerAPI, m.StorageDriver = info.Version, info.APIVersion, info.StorageDriver
		}
	}
	return m
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
