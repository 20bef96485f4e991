package sandbox_test

// The leak test of issue 7: after a VM ran with secrets of every source kind
// and made requests that carried them (allowed, blocked, mismatched, echoed
// back by the upstream), no secret value is anywhere the VM, the engine, the
// host-side state, the logs or the Manager's results can show.

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// pxScan looks for needles (secret values and encodings of them) in
// everything it is given, also across the chunks of a stream, and records
// where it found which.
type pxScan struct {
	needles map[string][]byte // label → bytes
	maxLen  int

	mu      sync.Mutex
	hits    map[string][]string // where → labels found
	scanned map[string]int64    // where → bytes scanned
}

func newPXScan(needles map[string]string) *pxScan {
	s := &pxScan{needles: map[string][]byte{}, hits: map[string][]string{}, scanned: map[string]int64{}}
	for label, n := range needles {
		s.needles[label] = []byte(n)
		s.maxLen = max(s.maxLen, len(n))
	}
	return s
}

// pxScanWriter scans a stream written to it.
type pxScanWriter struct {
	s     *pxScan
	where string
	tail  []byte
	found map[string]bool
	n     int64
}

func (s *pxScan) writer(where string) *pxScanWriter {
	return &pxScanWriter{s: s, where: where, found: map[string]bool{}}
}

func (w *pxScanWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	buf := append(w.tail, p...)
	for label, n := range w.s.needles {
		if !w.found[label] && bytes.Contains(buf, n) {
			w.found[label] = true
		}
	}
	keep := min(len(buf), w.s.maxLen-1)
	w.tail = append(w.tail[:0], buf[len(buf)-keep:]...)
	return len(p), nil
}

// Close records what the stream held.
func (w *pxScanWriter) Close() error {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.s.scanned[w.where] += w.n
	for label := range w.found {
		w.s.hits[w.where] = append(w.s.hits[w.where], label)
	}
	return nil
}

// bytes scans one blob.
func (s *pxScan) bytes(where string, b []byte) {
	w := s.writer(where)
	_, _ = w.Write(b)
	_ = w.Close()
}

// json scans the JSON encoding of v.
func (s *pxScan) json(t *testing.T, where string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %s: %v", where, err)
	}
	s.bytes(where, b)
}

// tar scans every entry of a tar stream (its name, link, extended records
// and content) as where:<entry name>, and returns how many entries it saw.
func (s *pxScan) tar(where string, r io.Reader) (int, error) {
	tr := tar.NewReader(r)
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("%s: %w", where, err)
		}
		n++
		name := where + ":" + h.Name
		meta := h.Name + "\x00" + h.Linkname
		for k, v := range h.PAXRecords {
			meta += "\x00" + k + "=" + v
		}
		s.bytes(name+" (header)", []byte(meta))
		w := s.writer(name)
		if _, err := io.Copy(w, tr); err != nil {
			return n, fmt.Errorf("%s: %w", name, err)
		}
		_ = w.Close()
	}
}

// file scans a host file or directory tree, skipping the paths in skip.
func (s *pxScan) tree(t *testing.T, root string, skip ...string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if slices.Contains(skip, path) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		s.bytes("host:"+path+" (name)", []byte(path))
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			s.bytes("host:"+path+" (link)", []byte(target))
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		w := s.writer("host:" + path)
		_, err = io.Copy(w, f)
		_ = w.Close()
		n++
		return err
	})
	if err != nil {
		t.Fatalf("scan %s: %v", root, err)
	}
	return n
}

// found returns where → labels, sorted.
func (s *pxScan) found() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for w, l := range s.hits {
		l = slices.Clone(l)
		sort.Strings(l)
		out[w] = slices.Compact(l)
	}
	return out
}

func (s *pxScan) total() (places int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.scanned {
		bytes += n
	}
	return len(s.scanned), bytes
}

// TestSecretsDoNotLeak runs a VM with four secrets (environment, file and
// command sources; one with body substitution), sends them everywhere, and
// then searches everything for their values.
func TestSecretsDoNotLeak(t *testing.T) {
	t.Parallel()
	start := time.Now()
	x := newPX(t)
	u := x.up
	dir := x.checkout(t, "pxleak", x.config("proxy", ""), nil)
	p := x.open(t, dir, nil)
	ctx := lcCtx(t)

	// Every result the Manager returns goes here, to be scanned as JSON.
	results := map[string]any{}
	res := x.create(t, p, sandbox.CreateOptions{})
	results["create"] = res
	var runs []sandbox.CommandResult
	run := func(user, script string) sandbox.CommandResult {
		t.Helper()
		r := x.run(t, p, sandbox.ExecOptions{Cmd: []string{"bash", "-c", script}, User: user})
		runs = append(runs, r)
		return r
	}

	// Requests with every secret, kept in files (the upstream echoes what it
	// got; the proxy masks the values on the way back), plus blocked and
	// mismatched ones.
	h := "https://" + u.host
	run("", `set -e
curl -sS -H "Authorization: Bearer $TOK" -H "X-File: $FTOK" "`+h+`/echo?id=leak-hdr&q=$TOK&c=$CTOK" > /tmp/echo-hdr.json
curl -sS -u "user:$TOK" "`+h+`/echo?id=leak-basic" > "$HOME/echo-basic.json"
curl -sS --data-binary "b=$BTOK" "`+h+`/echo?id=leak-body" > /workspace/echo-body.json
curl -sS -H "Authorization: Bearer $TOK" "https://`+u.other+`/echo?id=leak-blocked" > /tmp/blocked.txt || true
curl -sS --connect-to `+u.other+`:443:`+u.host+`:443 -H "Authorization: Bearer $TOK" "https://`+u.other+`/echo?id=leak-sni" > /tmp/sni.txt 2>&1 || true
curl -sS -H "Host: `+u.other+`" -H "Authorization: Bearer $TOK" "`+h+`/echo?id=leak-host" > /tmp/host.txt || true
echo "$TOK $BTOK $FTOK $CTOK" > "$HOME/placeholders.txt"
cat /tmp/echo-hdr.json`)
	// The requests did carry the values (the scan below would be
	// meaningless otherwise).
	if r := u.requests(t, "request", "leak-hdr"); len(r) != 1 || !slices.Equal(r[0].Headers["Authorization"], []string{"Bearer " + x.values["TOK"]}) {
		t.Fatalf("the upstream did not get the real value: %+v", r)
	}
	if r := u.requests(t, "request", "leak-body"); len(r) != 1 || r[0].Body != "b="+x.values["BTOK"] {
		t.Fatalf("the upstream did not get the body value: %+v", r)
	}

	// More results.
	again := x.create(t, p, sandbox.CreateOptions{})
	results["create again"] = again
	if pr, err := x.m.Provision(ctx, p); err != nil {
		t.Errorf("Provision: %v", err)
	} else {
		results["provision"] = pr
	}
	ev := x.pxEvents(t, p)
	if len(ev) == 0 {
		t.Fatal("no audit events")
	}
	results["audit"] = ev
	ps, err := x.m.ProxyStatus(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	results["proxy status"] = ps
	results["secrets"] = x.m.Secrets(p)
	st, err := x.m.Status(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	results["status"] = st
	if ls, err := x.m.List(ctx, sandbox.ListFilter{Checkout: p.ID.CheckoutSlug}); err != nil {
		t.Errorf("List: %v", err)
	} else {
		results["list"] = ls
	}
	results["project"] = p

	// The CLI's outputs.
	cli := x.cliIn(t, dir)
	cliOut := map[string]string{}
	for _, args := range [][]string{
		{"exec", "--", "env"},
		{"proxy", "audit", "--json"},
		{"proxy", "audit"},
		{"status", "--json"},
		{"config", "show"},
		{"create", "--json"},
	} {
		stdout, stderr, err := cli(args...)
		if err != nil {
			t.Errorf("agents-sandbox %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		cliOut[strings.Join(args, " ")] = stdout + "\n" + stderr
	}

	// Needles: the values, and the Basic credential the proxy built.
	needles := map[string]string{}
	for n, v := range x.values {
		needles[n] = v
		needles[n+" (base64)"] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	needles["TOK (Basic credential)"] = base64.StdEncoding.EncodeToString([]byte("user:" + x.values["TOK"]))
	scan := newPXScan(needles)
	_, pvm := x.proxyVM(t, p)
	vm, err := x.rt.InspectVM(ctx, p.Names.VM)
	if err != nil {
		t.Fatal(err)
	}

	// The VM's environment, every process's environ and command line, as
	// root.
	env := run("0:0", `for f in /proc/[0-9]*; do cat "$f/environ" "$f/cmdline" 2>/dev/null; echo; done; env`)
	scan.bytes("vm: /proc/*/environ, cmdline, env", []byte(env.Stdout.Text+env.Stderr.Text))
	if !strings.Contains(env.Stdout.Text, "TOK=agents-sandbox-placeholder-TOK-") {
		t.Errorf("the environ dump holds no placeholder: the scan of it proves nothing")
	}

	// The VM's whole filesystem, its home volume (not in an export) and the
	// checkout (a bind mount, scanned on the host below).
	exp, err := x.cli.ContainerExport(ctx, vm.ID, client.ContainerExportOptions{})
	if err != nil {
		t.Fatalf("export VM: %v", err)
	}
	nVM, err := scan.tar("vm export", exp)
	exp.Close()
	if err != nil {
		t.Fatal(err)
	}
	home, err := x.rt.CopyFrom(ctx, p.Names.VM, sandbox.HomeDir)
	if err != nil {
		t.Fatalf("copy home: %v", err)
	}
	nHome, err := scan.tar("vm home volume", home)
	home.Close()
	if err != nil {
		t.Fatal(err)
	}

	// The proxy's filesystem: its config holds the values by design (the
	// positive control of the scanner); nothing else may.
	pexp, err := x.cli.ContainerExport(ctx, pvm.ID, client.ContainerExportOptions{})
	if err != nil {
		t.Fatalf("export proxy: %v", err)
	}
	if _, err := scan.tar("proxy export", pexp); err != nil {
		t.Fatal(err)
	}
	pexp.Close()

	// docker inspect of both containers, the VM's network, the images'
	// config and history, the volume.
	for _, c := range []string{vm.ID, pvm.ID} {
		ci, err := x.cli.ContainerInspect(ctx, c, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		scan.bytes("docker inspect "+ci.Container.Name, ci.Raw)
	}
	if ni, err := x.cli.NetworkInspect(ctx, p.Names.VM+"-net", client.NetworkInspectOptions{}); err == nil {
		scan.bytes("docker network inspect", ni.Raw)
	} else {
		t.Errorf("inspect the VM's network: %v", err)
	}
	for _, img := range []string{res.ImageID, pvm.ImageID} {
		var raw bytes.Buffer
		if _, err := x.cli.ImageInspect(ctx, img, client.ImageInspectWithRawResponse(&raw)); err != nil {
			t.Fatal(err)
		}
		scan.bytes("docker image inspect "+img, raw.Bytes())
		hist, err := x.cli.ImageHistory(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		scan.json(t, "docker image history "+img, hist.Items)
	}
	vol, err := x.rt.InspectVolume(ctx, res.HomeVolume)
	if err != nil {
		t.Fatal(err)
	}
	scan.json(t, "volume inspect", vol)

	// Container logs.
	for _, c := range []string{vm.ID, pvm.ID} {
		logs, err := x.cli.ContainerLogs(ctx, c, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		var raw bytes.Buffer
		_, _ = io.Copy(&raw, logs)
		logs.Close()
		out, errOut := scan.writer("docker logs "+c[:12]+" (stdout)"), scan.writer("docker logs "+c[:12]+" (stderr)")
		if _, err := stdcopy.StdCopy(out, errOut, bytes.NewReader(raw.Bytes())); err != nil {
			scan.bytes("docker logs "+c[:12]+" (raw)", raw.Bytes()) // a TTY container's log is not multiplexed
		}
		out.Close()
		errOut.Close()
	}

	// The Manager's log, its results, the CLI's outputs.
	scan.bytes("Manager log", []byte(x.log.String()))
	results["commands"] = runs
	for k, v := range results {
		scan.json(t, "result "+k, v)
	}
	for k, v := range cliOut {
		scan.bytes("agents-sandbox "+k, []byte(v))
	}

	// On the host: the state, config and cache directories, the home, the
	// checkout: all of the test's tree but the secrets' own source files.
	nHost := scan.tree(t, x.root, x.srcDir)

	// Stopping, last.
	stopped, err := x.m.Stop(ctx, p, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	scan.json(t, "result stop", stopped)

	// The files the requests left are among what was scanned.
	for _, where := range []string{"vm export:tmp/echo-hdr.json", "vm export:tmp/blocked.txt", "vm home volume:dev/echo-basic.json", "host:" + filepath.Join(dir, "echo-body.json")} {
		scan.mu.Lock()
		n := scan.scanned[where]
		scan.mu.Unlock()
		if n == 0 {
			t.Errorf("control: %s was not scanned (or is empty)", where)
		}
	}

	found := scan.found()
	for where, labels := range found {
		if strings.HasPrefix(where, "proxy export:config/proxy.json") {
			continue
		}
		t.Errorf("%s holds %s", where, strings.Join(labels, ", "))
	}
	cfg := found["proxy export:config/proxy.json"]
	for _, n := range pxSecretNames {
		if !slices.Contains(cfg, n) {
			t.Errorf("control: the scan did not find %s in the proxy's own config (found %v): the scanner is broken", n, cfg)
		}
	}
	places, total := scan.total()
	t.Logf("scanned %d places, %.1f MiB (VM export %d entries, home volume %d entries, host files %d); took %s",
		places, float64(total)/(1<<20), nVM, nHome, nHost, time.Since(start).Round(time.Millisecond))
}
