package sandbox_test

// End-to-end tests of the secret proxy in the VM lifecycle (issue 7) against
// the real engine: a VM in network.mode "proxy" talks, with curl, through its
// proxy container to a test HTTPS upstream that the test starts itself on the
// proxies' egress network (tests/upstream, in a busybox container, with a CA
// of its own given to the project as image.ca_certificates). The upstream
// records what reaches it; the test reads the record from the container,
// never through the proxy.
//
// Nothing here dials an address outside loopback and the containers the
// tests start: blocking is proved at the proxy (403/407/421, audit events,
// an upstream that recorded nothing) or by the network layout (connections
// from the VM to the upstream's and the host's addresses fail).
//
// The helpers (px*) are shared with leak_test.go.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/internal/testbin"
	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/proxy"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// pxLabelTest marks the Docker objects these tests make besides the
// Manager's own (the upstream containers), with a per-test value.
const pxLabelTest = "org.agents-sandbox.test"

// pxSecretNames are the secrets every proxy test configures, one per kind
// of source: TOK and BTOK from the Manager's environment (BTOK with body
// substitution), FTOK from a file, CTOK from a command.
var pxSecretNames = []string{"BTOK", "CTOK", "FTOK", "TOK"}

// pxEnv is one proxy test: an lcEnv whose Manager logs into a buffer too, a
// raw engine client for what the Runtime interface does not offer (export,
// raw inspect, logs, stats), a test upstream and the secret values.
type pxEnv struct {
	*lcEnv
	cli    *client.Client
	log    *pxBuffer
	up     *pxUpstream
	values map[string]string // secret name → value
	srcDir string            // host directory holding the file and command sources
}

// newPX makes the test's Manager, starts its upstream and picks fresh
// secret values (in the Manager's environment and in files outside the
// checkout).
func newPX(t *testing.T) *pxEnv {
	t.Helper()
	e := newLC(t, lcOptions{})
	x := &pxEnv{lcEnv: e, log: &pxBuffer{}, values: map[string]string{}}
	x.m.Log = zerolog.New(zerolog.MultiLevelWriter(zerolog.NewTestWriter(t), x.log)).Level(zerolog.DebugLevel)
	ctx := lcCtx(t)
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		t.Fatalf("docker ping: %v", err)
	}
	x.cli = cli
	for _, n := range pxSecretNames {
		x.values[n] = "v4lue-" + n + "-" + pxRandHex(16)
	}
	x.srcDir = filepath.Join(e.root, "secret-sources")
	lcWrite(t, filepath.Join(x.srcDir, "ftok"), x.values["FTOK"]+"\n", 0o600)
	lcWrite(t, filepath.Join(x.srcDir, "ctok"), x.values["CTOK"]+"\n", 0o600)
	x.m.Environ = append(x.m.Environ, "ASB_TEST_TOK="+x.values["TOK"], "ASB_TEST_BTOK="+x.values["BTOK"])
	x.up = x.startUpstream(t)
	return x
}

// config is a project config in network mode mode with the four secrets
// (all bound to the upstream's first name), the upstream's other name on the
// allow list, and the upstream's address allowed explicitly (it is a private
// address, which the proxy refuses unless an IP entry allows it). extra is
// appended.
func (x *pxEnv) config(mode, extra string) string {
	u := x.up
	return fmt.Sprintf(`agent = "shell"
[image]
ca_certificates = [%q]
[network]
mode = %q
allow = [%q, %q]
[secrets.TOK]
from = "env:ASB_TEST_TOK"
hosts = [%q]
[secrets.BTOK]
from = "env:ASB_TEST_BTOK"
hosts = [%q]
body = true
[secrets.FTOK]
from = "file:%s"
hosts = [%q]
[secrets.CTOK]
from = "command:cat %s"
hosts = [%q]
%s`, u.caFile, mode, u.other, u.ip, u.host, u.host, filepath.Join(x.srcDir, "ftok"), u.host, filepath.Join(x.srcDir, "ctok"), u.host, extra)
}

// proxyVM returns the name of the project's proxy container and its state.
func (x *pxEnv) proxyVM(t *testing.T, p *sandbox.Project) (string, sandbox.VM) {
	t.Helper()
	ps, err := x.m.ProxyStatus(lcCtx(t), p)
	if err != nil {
		t.Fatalf("ProxyStatus: %v", err)
	}
	vm, err := x.rt.InspectVM(lcCtx(t), ps.Container)
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("inspect proxy %s: %v", ps.Container, err)
	}
	return ps.Container, vm
}

// pxCurl is the outcome of one curl in the VM.
type pxCurl struct {
	Exit    int    // curl's exit code
	Code    int    // HTTP status of the last response (0: none)
	Connect int    // status of the CONNECT (0: none)
	Headers string // all response header blocks, CONNECT's included
	Body    string
	Stderr  string
}

// header returns the value of the last header called name.
func (c pxCurl) header(name string) string {
	v := ""
	for _, line := range strings.Split(c.Headers, "\n") {
		k, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && strings.EqualFold(k, name) {
			v = strings.TrimSpace(val)
		}
	}
	return v
}

// curl runs `curl -sS <args>` in the VM. args is shell text, so it can name
// the VM's variables ("$TOK"); the request goes through HTTPS_PROXY unless
// args say otherwise.
func (x *pxEnv) curl(t *testing.T, p *sandbox.Project, args string) pxCurl {
	t.Helper()
	script := `h=$(mktemp); b=$(mktemp)
w=$(curl -sS --max-time 60 -D "$h" -o "$b" -w '%{http_code} %{http_connect}' ` + args + `)
rc=$?
printf 'rc=%s w=%s\n' "$rc" "$w"; cat "$h"; printf '\n--body--\n'; cat "$b"; rm -f "$h" "$b"`
	res := x.run(t, p, sandbox.ExecOptions{Cmd: []string{"sh", "-c", script}})
	out := res.Stdout.Text
	first, rest, _ := strings.Cut(out, "\n")
	var c pxCurl
	var w1, w2 string
	if _, err := fmt.Sscanf(first, "rc=%d w=%s %s", &c.Exit, &w1, &w2); err != nil {
		t.Fatalf("curl %s: unexpected output %q (stderr %q): %v", args, out, res.Stderr.Text, err)
	}
	c.Code, _ = strconv.Atoi(w1)
	c.Connect, _ = strconv.Atoi(w2)
	c.Headers, c.Body, _ = strings.Cut(rest, "\n--body--\n")
	c.Stderr = res.Stderr.Text
	return c
}

// ---------------------------------------------------------------------------
// The test upstream.

// pxCA is the upstream's CA, made once per test process so every test's
// runner image gets the same image.ca_certificates content (and the build
// cache serves them all).
type pxCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var pxTestCA = sync.OnceValues(func() (*pxCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "agents-sandbox test upstream CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &pxCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
})

// serverCert returns a certificate and key (PEM) for names, signed by the CA.
func (ca *pxCA) serverCert(names ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// pxUpstreamBin builds tests/upstream (static) once per test process.
var pxUpstreamBin = sync.OnceValues(func() (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "agents-sandbox-upstream-*")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "upstream")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./tests/upstream")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build tests/upstream: %w\n%s", err, out)
	}
	return bin, nil
})

// pxUpstream is a running test upstream.
type pxUpstream struct {
	x      *pxEnv
	name   string // container
	host   string // the name the secrets are bound to, "up-<id>.test"
	other  string // a second name of the same server, allowed by network.allow only
	ip     string // its address on the egress network
	caFile string // host path of its CA certificate (PEM)
}

// pxRecord is one line of the upstream's record (see tests/upstream).
type pxRecord struct {
	Kind    string              `json:"kind"`
	TimeNS  int64               `json:"time_ns"`
	Remote  string              `json:"remote"`
	Host    string              `json:"host"`
	SNI     string              `json:"sni"`
	Proto   string              `json:"proto"`
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Query   string              `json:"query"`
	Headers map[string][]string `json:"headers"`
	Body    string              `json:"body"`
	ID      string              `json:"id"`
	Detail  string              `json:"detail"`
	Bytes   int64               `json:"bytes"`
}

// startUpstream starts the test's upstream on the egress network (made here
// if no proxy made it yet, exactly as the Manager makes it) under two fresh
// names, and waits until it listens.
func (x *pxEnv) startUpstream(t *testing.T) *pxUpstream {
	t.Helper()
	ctx := lcCtx(t)
	ca, err := pxTestCA()
	if err != nil {
		t.Fatalf("test CA: %v", err)
	}
	bin, err := pxUpstreamBin()
	if err != nil {
		t.Fatal(err)
	}
	id := pxRandHex(5)
	u := &pxUpstream{x: x, name: "agents-sandbox-test-upstream-" + id, host: "up-" + id + ".test", other: "other-" + id + ".test"}
	u.caFile = filepath.Join(x.root, "upstream-ca", "upstream-ca.pem")
	lcWrite(t, u.caFile, string(ca.pem), 0o644)
	certPEM, keyPEM, err := ca.serverCert(u.host, u.other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.rt.CreateNetwork(ctx, sandbox.NetworkSpec{Name: sandbox.EgressNetwork, Labels: map[string]string{sandbox.LabelKind: string(sandbox.KindNet)}}); err != nil && !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("create network %s: %v", sandbox.EgressNetwork, err)
	}
	_, err = x.rt.CreateVM(ctx, sandbox.VMSpec{
		Name:           u.name,
		Image:          testenv.BusyboxImage(t),
		Labels:         map[string]string{sandbox.LabelKind: "test-upstream", pxLabelTest: id},
		Entrypoint:     []string{"/upstream", "-cert", "/srv.pem", "-key", "/srv-key.pem"},
		Cmd:            []string{},
		Network:        sandbox.EgressNetwork,
		NetworkAliases: []string{u.host, u.other},
		StopTimeout:    2 * time.Second,
	})
	if err != nil {
		t.Fatalf("create upstream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := x.rt.RemoveVM(ctx, u.name, true); err != nil {
			t.Errorf("cleanup: remove upstream %s: %v", u.name, err)
		}
	})
	binData, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.rt.CopyTo(ctx, u.name, "/", pxTar(map[string][]byte{"upstream": binData, "srv.pem": certPEM, "srv-key.pem": keyPEM})); err != nil {
		t.Fatalf("copy into upstream: %v", err)
	}
	if err := x.rt.StartVM(ctx, u.name); err != nil {
		t.Fatalf("start upstream: %v", err)
	}
	lcWaitFor(t, 15*time.Second, "upstream listening", func() (bool, string) {
		_, err := u.recordsErr(ctx)
		return err == nil, fmt.Sprint(err)
	})
	vm, err := x.rt.InspectVM(ctx, u.name)
	if err != nil {
		t.Fatal(err)
	}
	u.ip = vm.Networks[sandbox.EgressNetwork]
	if _, err := netip.ParseAddr(u.ip); err != nil {
		t.Fatalf("upstream address on %s: %q (%v)", sandbox.EgressNetwork, u.ip, vm.Networks)
	}
	return u
}

// pxTar is a tar of regular files (mode 0755 for "upstream", else 0644).
func pxTar(files map[string][]byte) io.Reader {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		mode := int64(0o644)
		if n == "upstream" {
			mode = 0o755
		}
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode, Size: int64(len(files[n])), ModTime: time.Now()})
		_, _ = tw.Write(files[n])
	}
	_ = tw.Close()
	return &buf
}

func (u *pxUpstream) recordsErr(ctx context.Context) ([]pxRecord, error) {
	rc, err := u.x.rt.CopyFrom(ctx, u.name, "/records.jsonl")
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		return nil, fmt.Errorf("records: %w", err)
	}
	var out []pxRecord
	sc := bufio.NewScanner(tr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r pxRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("record %q: %w", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// records returns everything the upstream recorded so far.
func (u *pxUpstream) records(t *testing.T) []pxRecord {
	t.Helper()
	r, err := u.recordsErr(lcCtx(t))
	if err != nil {
		t.Fatalf("upstream records: %v", err)
	}
	return r
}

// requests returns the recorded requests whose id query parameter is id.
func (u *pxUpstream) requests(t *testing.T, kind, id string) []pxRecord {
	t.Helper()
	var out []pxRecord
	for _, r := range u.records(t) {
		if r.Kind == kind && r.ID == id {
			out = append(out, r)
		}
	}
	return out
}

// probe runs, in the upstream's container, a CONNECT without credential to
// the proxy at addr and returns the status line it got.
func (u *pxUpstream) probe(t *testing.T, addr string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	r, err := u.x.rt.Exec(lcCtx(t), u.name, sandbox.ExecRequest{Cmd: []string{"/upstream", "-probe", addr, "-probe-target", u.host + ":443"}, Stdout: &out, Stderr: &errOut})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("probe %s from the upstream: exit %d, %v: %s", addr, r.ExitCode, err, errOut.String())
	}
	return strings.TrimSpace(out.String())
}

// ---------------------------------------------------------------------------
// Small helpers.

func pxRandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pxBuffer is a concurrency-safe log sink.
type pxBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *pxBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *pxBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// pxEvents returns the project's audit events (all kept).
func (x *pxEnv) pxEvents(t *testing.T, p *sandbox.Project) []proxy.AuditEvent {
	t.Helper()
	ev, err := x.m.AuditEvents(lcCtx(t), p, 0)
	if err != nil {
		t.Fatalf("AuditEvents: %v", err)
	}
	return ev
}

// findEvent returns the first event matching all set fields of want.
func pxFindEvent(events []proxy.AuditEvent, want proxy.AuditEvent) (proxy.AuditEvent, bool) {
	for _, e := range events {
		if (want.Action == "" || e.Action == want.Action) && (want.Secret == "" || e.Secret == want.Secret) &&
			(want.Host == "" || e.Host == want.Host) && (want.Method == "" || e.Method == want.Method) &&
			(want.Reason == "" || strings.Contains(e.Reason, want.Reason)) {
			return e, true
		}
	}
	return proxy.AuditEvent{}, false
}

// ---------------------------------------------------------------------------
// Tests.

// TestProxyVM runs one VM in proxy mode through the substitution, blocking,
// destination checks, streaming and isolation cases, in order.
func TestProxyVM(t *testing.T) {
	t.Parallel()
	start := time.Now()
	x := newPX(t)
	u := x.up
	p := x.open(t, x.checkout(t, "pxvm", x.config("proxy", ""), nil), nil)
	res := x.create(t, p, sandbox.CreateOptions{})
	t.Logf("VM up after %s (proxy start %d ms)", time.Since(start).Round(time.Millisecond), res.TimingsMS["proxy"])
	proxyName, proxyVM := x.proxyVM(t, p)
	if proxyVM.State != sandbox.VMRunning {
		t.Fatalf("proxy %s: state %s, want running", proxyName, proxyVM.State)
	}

	// What the VM sees: placeholders, the proxy, the proxy's CA.
	env := x.sh(t, p, "env")
	for _, n := range pxSecretNames {
		if !strings.Contains(env, n+"="+proxy.PlaceholderPrefix+n+"-") {
			t.Errorf("the VM's %s is not a placeholder; env:\n%s", n, env)
		}
	}
	if !strings.Contains(env, "HTTPS_PROXY=http://vm:") || !strings.Contains(env, "@proxy:3128") {
		t.Errorf("the VM has no HTTPS_PROXY pointing at the proxy; env:\n%s", env)
	}

	t.Run("allowed", func(t *testing.T) {
		c := x.curl(t, p, `-H "Authorization: Bearer $TOK" -H "X-File: $FTOK" "https://`+u.host+`/echo?id=hdr&q=$TOK&c=$CTOK"`)
		if c.Exit != 0 || c.Code != 200 {
			t.Fatalf("header/query request: %+v", c)
		}
		// The upstream echoes what it got; the proxy masks the values on the
		// way back, so the VM reads its placeholders again.
		if !strings.Contains(c.Body, proxy.PlaceholderPrefix+"TOK-") {
			t.Errorf("echo to the VM holds no placeholder (not masked back?): %s", c.Body)
		}
		x.curl(t, p, `-u "user:$TOK" "https://`+u.host+`/echo?id=basic"`)
		x.curl(t, p, `--data-binary "b=$BTOK&t=$TOK" "https://`+u.host+`/echo?id=body"`)

		v := x.values
		r := u.requests(t, "request", "hdr")
		if len(r) != 1 {
			t.Fatalf("upstream got %d requests with id=hdr, want 1", len(r))
		}
		if got := r[0].Headers["Authorization"]; !slices.Equal(got, []string{"Bearer " + v["TOK"]}) {
			t.Errorf("Authorization at the upstream: %q, want the real value of TOK", got)
		}
		if got := r[0].Headers["X-File"]; !slices.Equal(got, []string{v["FTOK"]}) {
			t.Errorf("X-File at the upstream: %q, want the real value of FTOK (file source)", got)
		}
		if want := "id=hdr&q=" + v["TOK"] + "&c=" + v["CTOK"]; r[0].Query != want {
			t.Errorf("query at the upstream: %q, want %q (TOK, and CTOK from a command source)", r[0].Query, want)
		}
		if r[0].Host != u.host || r[0].SNI != u.host {
			t.Errorf("upstream saw Host %q, SNI %q; want %s", r[0].Host, r[0].SNI, u.host)
		}
		r = u.requests(t, "request", "basic")
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+v["TOK"]))
		if len(r) != 1 || !slices.Equal(r[0].Headers["Authorization"], []string{want}) {
			t.Errorf("Basic credential at the upstream: %+v, want %q", r, want)
		}
		// BTOK says body = true; TOK does not, so its placeholder in a body
		// goes out as the harmless placeholder it is.
		r = u.requests(t, "request", "body")
		if len(r) != 1 || !strings.HasPrefix(r[0].Body, "b="+v["BTOK"]+"&t="+proxy.PlaceholderPrefix+"TOK-") {
			t.Errorf("body at the upstream: %+v; want BTOK substituted and TOK's placeholder left", r)
		}
		events := x.pxEvents(t, p)
		for _, n := range []string{"TOK", "FTOK", "CTOK", "BTOK"} {
			if _, ok := pxFindEvent(events, proxy.AuditEvent{Action: proxy.ActionSubstituted, Secret: n, Host: u.host}); !ok {
				t.Errorf("no substituted audit event for %s in %+v", n, events)
			}
		}
	})

	t.Run("blocked for a host the secret does not name", func(t *testing.T) {
		plain := x.curl(t, p, `"https://`+u.other+`/echo?id=plain-other"`)
		if plain.Code != 200 {
			t.Fatalf("%s without a placeholder (allowed by network.allow): %+v", u.other, plain)
		}
		c := x.curl(t, p, `-H "Authorization: Bearer $TOK" "https://`+u.other+`/echo?id=blocked"`)
		if c.Code != 403 || c.header("X-Agents-Sandbox-Proxy") != "blocked" || !strings.Contains(c.Body, "secret TOK may not be sent to "+u.other) {
			t.Errorf("placeholder to %s: %+v; want 403 blocked naming TOK", u.other, c)
		}
		q := x.curl(t, p, `"https://`+u.other+`/echo?id=blocked-query&k=$CTOK"`)
		if q.Code != 403 {
			t.Errorf("placeholder in the query to %s: %+v; want 403", u.other, q)
		}
		if r := append(u.requests(t, "request", "blocked"), u.requests(t, "request", "blocked-query")...); len(r) != 0 {
			t.Errorf("the upstream got the blocked requests: %+v", r)
		}
		events := x.pxEvents(t, p)
		ev, ok := pxFindEvent(events, proxy.AuditEvent{Action: proxy.ActionBlocked, Secret: "TOK", Host: u.other})
		if !ok || ev.VM != p.Names.VM || ev.Time.IsZero() || ev.Path != "/echo" {
			t.Errorf("audit event for the blocked request: %+v (found %v) in %+v", ev, ok, events)
		}
		if _, ok := pxFindEvent(events, proxy.AuditEvent{Action: proxy.ActionBlocked, Secret: "CTOK", Host: u.other}); !ok {
			t.Errorf("no audit event for the blocked query: %+v", events)
		}
	})

	t.Run("destination mismatch", func(t *testing.T) {
		// CONNECT to the secret's host, then TLS and Host for the other.
		sni := x.curl(t, p, `--connect-to `+u.other+`:443:`+u.host+`:443 -H "Authorization: Bearer $TOK" "https://`+u.other+`/echo?id=sni"`)
		if sni.Exit == 0 || sni.Connect != 200 {
			t.Errorf("CONNECT %s with SNI %s: %+v; want the tunnel, then a failed handshake", u.host, u.other, sni)
		}
		// The reverse: CONNECT to the other, SNI and Host of the secret's host.
		rev := x.curl(t, p, `--connect-to `+u.host+`:443:`+u.other+`:443 -H "Authorization: Bearer $TOK" "https://`+u.host+`/echo?id=sni2"`)
		if rev.Exit == 0 {
			t.Errorf("CONNECT %s with SNI %s: %+v; want a failed handshake", u.other, u.host, rev)
		}
		// CONNECT and SNI agree, the Host header names the other.
		host := x.curl(t, p, `-H "Host: `+u.other+`" -H "Authorization: Bearer $TOK" "https://`+u.host+`/echo?id=host"`)
		if host.Code != 421 || host.header("X-Agents-Sandbox-Proxy") != "refused" {
			t.Errorf("Host %s inside a tunnel to %s: %+v; want 421 refused", u.other, u.host, host)
		}
		for _, id := range []string{"sni", "sni2", "host"} {
			if r := u.requests(t, "request", id); len(r) != 0 {
				t.Errorf("the upstream got request %s: %+v", id, r)
			}
		}
		events := x.pxEvents(t, p)
		for _, want := range []proxy.AuditEvent{
			{Action: proxy.ActionRefused, Method: "CONNECT", Host: u.host, Reason: "TLS SNI"},
			{Action: proxy.ActionRefused, Method: "CONNECT", Host: u.other, Reason: "TLS SNI"},
			{Action: proxy.ActionRefused, Host: u.host, Reason: "inside a tunnel to " + u.host},
		} {
			if _, ok := pxFindEvent(events, want); !ok {
				t.Errorf("no audit event like %+v in %+v", want, events)
			}
		}
	})

	t.Run("address not allowed", func(t *testing.T) {
		// The allow list holds an IP entry (the upstream's), so names are
		// decided on their resolved addresses (see TestProxyVMPolicy for
		// names); IP literals are decided before any dial. Both targets are
		// harmless even if dialed: the proxy's own loopback and its own
		// address.
		_, pvm := x.proxyVM(t, p)
		for _, ip := range []string{"127.0.0.1", pvm.Networks[sandbox.EgressNetwork]} {
			c := x.curl(t, p, `--noproxy '' "https://`+ip+`/echo"`) // past NO_PROXY
			if c.Connect != 403 || c.Exit == 0 {
				t.Errorf("CONNECT %s: %+v; want 403 at CONNECT", ip, c)
			}
			if _, ok := pxFindEvent(x.pxEvents(t, p), proxy.AuditEvent{Action: proxy.ActionRefused, Method: "CONNECT", Host: ip, Reason: "address"}); !ok {
				t.Errorf("no refused audit event for %s", ip)
			}
		}
	})

	t.Run("server-sent events stream", func(t *testing.T) {
		id := "sse-" + pxRandHex(4)
		script := `start=$(date +%s%N)
coproc C { exec curl -sSN --max-time 60 "https://` + u.host + `/sse?id=` + id + `"; }
exec 3<&"${C[0]}"
while IFS= read -r line <&3; do
  case "$line" in
  "data: first"*) first=$(date +%s%N); curl -sS --max-time 30 -o /dev/null "https://` + u.host + `/release?id=` + id + `";;
  "data: last"*) echo "last=${line#data: last }";;
  esac
done
echo "first=$first start=$start"`
		res := x.run(t, p, sandbox.ExecOptions{Cmd: []string{"bash", "-c", script}})
		out := res.Stdout.Text
		// The upstream ends the stream only when released, and the VM
		// releases it when the first event arrives: "released" proves the
		// first event came through before the stream ended.
		if !strings.Contains(out, "last=released") {
			t.Fatalf("SSE: %q (stderr %q); want the first event before the end of the stream (last=released)", out, res.Stderr.Text)
		}
		var firstNS, startNS int64
		if i := strings.Index(out, "first="); i >= 0 {
			fmt.Sscanf(out[i:], "first=%d start=%d", &firstNS, &startNS)
		}
		var sentNS int64
		for _, r := range u.records(t) {
			if r.Kind == "sse-first" && r.ID == id {
				sentNS = r.TimeNS
			}
		}
		// The VM and the upstream share the host's clock.
		t.Logf("SSE first event: written by the upstream → read in the VM %.1f ms; request start → first event %.1f ms",
			float64(firstNS-sentNS)/1e6, float64(firstNS-startNS)/1e6)
	})

	t.Run("no egress but the proxy", func(t *testing.T) {
		ctx := lcCtx(t)
		netName := p.Names.VM + "-net"
		nw, err := x.rt.InspectNetwork(ctx, netName)
		if err != nil || !nw.Internal || !nw.NoHostAccess {
			t.Errorf("the VM's network %s: %+v, %v; want internal, without a host address", netName, nw, err)
		}
		vm, err := x.rt.InspectVM(ctx, p.Names.VM)
		if err != nil {
			t.Fatal(err)
		}
		if len(vm.Networks) != 1 || vm.Networks[netName] == "" {
			t.Errorf("the VM's networks: %v; want only %s", vm.Networks, netName)
		}
		if ifs := strings.Fields(x.sh(t, p, "ls /sys/class/net")); !slices.Equal(ifs, []string{"eth0", "lo"}) {
			t.Errorf("the VM's interfaces: %v; want eth0 and lo", ifs)
		}
		// Docker installs a default route even on an internal network; its
		// gateway address belongs to nobody (the bridge has no address).
		gw := pxDefaultGateway(t, x.sh(t, p, "cat /proc/net/route"))
		egressGW := pxGateway(t, x.cli, sandbox.EgressNetwork)
		vmGW := pxGateway(t, x.cli, netName)
		t.Logf("the VM's default route: via %s (its network's gateway %s); the egress network's gateway %s", gw, vmGW, egressGW)

		// A listener of the test on every host address: the VM must reach
		// none of them.
		l, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var accepted atomic.Int32
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		before := len(u.records(t))
		// In parallel: each failing attempt waits for its connect timeout.
		script := `try() { if curl -sS --noproxy '*' --connect-timeout 4 --max-time 6 -o /dev/null "$1" 2>/dev/null; then echo "$1 ok"; else echo "$1 rc=$?"; fi; }
try "https://` + u.ip + `/echo?id=direct" &
try "http://` + gw + `:` + port + `/" &
try "http://` + vmGW + `:` + port + `/" &
try "http://` + egressGW + `:` + port + `/" &
try "http://proxy:3128/healthz" &
wait`
		out := x.sh(t, p, script)
		t.Logf("direct connections from the VM:\n%s", out)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			target, result, _ := strings.Cut(line, " ")
			control := strings.Contains(target, "proxy:3128")
			switch {
			case control && result != "ok":
				t.Errorf("control: the VM cannot reach its proxy directly (%s): the method is broken", line)
			case !control && (result == "ok" || result == "rc=52" || result == "rc=35"):
				// 52 (empty reply) and 35 (TLS failure) mean it connected.
				t.Errorf("the VM connected to %s without the proxy (%s)", target, result)
			}
		}
		if n := accepted.Load(); n != 0 {
			t.Errorf("the test's host listener accepted %d connections from the VM", n)
		}
		for _, r := range u.records(t)[before:] {
			if r.Kind == "conn" {
				t.Errorf("the upstream accepted a connection from %s while the VM tried it directly", r.Remote)
			}
		}
		// Through the proxy the same upstream answers (see "allowed"), and
		// every connection the upstream ever saw came from the proxy.
		_, pvm := x.proxyVM(t, p)
		for _, r := range u.records(t) {
			if r.Kind == "conn" && !strings.HasPrefix(r.Remote, pvm.Networks[sandbox.EgressNetwork]+":") {
				t.Errorf("the upstream saw a connection from %s, not from the proxy (%s)", r.Remote, pvm.Networks[sandbox.EgressNetwork])
			}
		}
	})

	t.Run("only its own VM can use the proxy", func(t *testing.T) {
		for _, c := range []struct{ name, args string }{
			{"no credential", `--proxy http://proxy:3128 "https://` + u.host + `/echo?id=noauth"`},
			{"wrong credential", `--proxy http://vm:wrong@proxy:3128 "https://` + u.host + `/echo?id=noauth"`},
			{"plain HTTP, no credential", `--proxy http://proxy:3128 "http://` + u.host + `/echo?id=noauth"`},
		} {
			r := x.curl(t, p, c.args)
			if r.Connect != 407 && r.Code != 407 {
				t.Errorf("%s: %+v; want 407", c.name, r)
			}
		}
		// From the shared egress network, where other checkouts' proxies
		// live: the upstream's container is there.
		_, pvm := x.proxyVM(t, p)
		addr := net.JoinHostPort(pvm.Networks[sandbox.EgressNetwork], "3128")
		if got := u.probe(t, addr); !strings.HasPrefix(got, "HTTP/1.1 407") {
			t.Errorf("CONNECT without credential from the egress network to %s: %q; want 407", addr, got)
		}
		if r := u.requests(t, "request", "noauth"); len(r) != 0 {
			t.Errorf("the upstream got unauthenticated requests: %+v", r)
		}
	})

	t.Run("the VM cannot read the proxy's config", func(t *testing.T) {
		out := x.shAs(t, p, "0:0", `ls /config /audit 2>&1; find / -xdev \( -name proxy.json -o -name ca-key.pem \) 2>/dev/null; echo end`)
		if strings.Contains(out, "proxy.json") || strings.Contains(out, "ca-key.pem") {
			t.Errorf("the VM sees the proxy's files: %s", out)
		}
	})
	t.Logf("TestProxyVM took %s", time.Since(start).Round(time.Millisecond))
}

// pxDefaultGateway returns the gateway of the default route in
// /proc/net/route, or "" when there is none.
func pxDefaultGateway(t *testing.T, route string) string {
	t.Helper()
	for _, line := range strings.Split(route, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 3 || f[1] != "00000000" {
			continue
		}
		b, err := hex.DecodeString(f[2])
		if err != nil || len(b) != 4 {
			t.Fatalf("route line %q", line)
		}
		return netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}).String()
	}
	return ""
}

// pxGateway returns the IPv4 gateway the engine assigned to a network.
func pxGateway(t *testing.T, cli *client.Client, name string) string {
	t.Helper()
	res, err := cli.NetworkInspect(lcCtx(t), name, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatalf("inspect network %s: %v", name, err)
	}
	for _, c := range res.Network.IPAM.Config {
		if c.Gateway.Is4() {
			return c.Gateway.String()
		}
	}
	t.Fatalf("network %s has no IPv4 gateway: %+v", name, res.Network.IPAM)
	return ""
}

// TestProxyVMPolicy: in proxy mode a name off the allow list is refused at
// CONNECT, before it is even resolved, and an allowed name whose address is
// private is refused at dial time unless an IP entry allows that address.
func TestProxyVMPolicy(t *testing.T) {
	t.Parallel()
	x := newPX(t)
	u := x.up
	// No IP entry this time: the upstream's name is allowed, its private
	// address is not.
	cfg := fmt.Sprintf("agent = \"shell\"\n[image]\nca_certificates = [%q]\n[network]\nmode = \"proxy\"\nallow = [%q]\n", u.caFile, u.host)
	p := x.open(t, x.checkout(t, "pxpolicy", cfg, nil), nil)
	x.create(t, p, sandbox.CreateOptions{})

	name := "nowhere-" + pxRandHex(4) + ".test"
	c := x.curl(t, p, `"https://`+name+`/echo"`)
	if c.Connect != 403 || c.Exit == 0 {
		t.Errorf("CONNECT %s: %+v; want 403 at CONNECT", name, c)
	}
	c = x.curl(t, p, `"https://`+u.host+`/echo?id=private"`)
	if c.Code != 403 || c.header("X-Agents-Sandbox-Proxy") != "refused" || !strings.Contains(c.Body, "private address "+u.ip) {
		t.Errorf("%s at the private address %s: %+v; want 403 naming the address", u.host, u.ip, c)
	}
	if r := u.records(t); len(r) != 0 {
		t.Errorf("the upstream recorded %+v; want nothing", r)
	}
	events := x.pxEvents(t, p)
	for _, want := range []proxy.AuditEvent{
		{Action: proxy.ActionRefused, Method: "CONNECT", Host: name, Reason: "not on the allow list"},
		{Action: proxy.ActionRefused, Host: u.host, Reason: "private address"},
	} {
		if _, ok := pxFindEvent(events, want); !ok {
			t.Errorf("no audit event like %+v in %+v", want, events)
		}
	}
}

// TestProxyVMModeSwitch: the VM's network follows network.mode. In open
// mode (with secrets) the VM's network is an ordinary bridge beside the
// proxy; switched to proxy mode, that network is replaced by an internal
// one without a host address, not reused with its route out.
func TestProxyVMModeSwitch(t *testing.T) {
	t.Parallel()
	x := newPX(t)
	dir := x.checkout(t, "pxswitch", x.config("open", ""), nil)
	p := x.open(t, dir, nil)
	x.create(t, p, sandbox.CreateOptions{})
	netName := p.Names.VM + "-net"
	ctx := lcCtx(t)
	nw, err := x.rt.InspectNetwork(ctx, netName)
	if err != nil || nw.Internal || nw.NoHostAccess {
		t.Fatalf("open mode: network %+v, %v; want an ordinary bridge", nw, err)
	}
	if c := x.curl(t, p, `-H "Authorization: Bearer $TOK" "https://`+x.up.host+`/echo?id=open"`); c.Code != 200 {
		t.Errorf("open mode: request through the proxy: %+v", c)
	}

	lcWrite(t, filepath.Join(dir, ".agents-sandbox", "config.toml"), x.config("proxy", ""), 0o644)
	p = x.open(t, dir, nil)
	res := x.create(t, p, sandbox.CreateOptions{})
	if res.Action == sandbox.VMReused || res.Action == sandbox.VMStarted {
		t.Errorf("switch to proxy mode: the VM was %s, want a new one", res.Action)
	}
	nw, err = x.rt.InspectNetwork(ctx, netName)
	if err != nil || !nw.Internal || !nw.NoHostAccess {
		t.Errorf("proxy mode after open mode: network %+v, %v; want internal without a host address", nw, err)
	}
	vm, err := x.rt.InspectVM(ctx, p.Names.VM)
	if err != nil || len(vm.Networks) != 1 || vm.Networks[netName] == "" {
		t.Errorf("the VM's networks after the switch: %v, %v", vm.Networks, err)
	}
	if c := x.curl(t, p, `-H "Authorization: Bearer $TOK" "https://`+x.up.host+`/echo?id=proxy"`); c.Code != 200 {
		t.Errorf("proxy mode: request through the proxy: %+v", c)
	}
	if r := x.up.requests(t, "request", "proxy"); len(r) != 1 || !slices.Equal(r[0].Headers["Authorization"], []string{"Bearer " + x.values["TOK"]}) {
		t.Errorf("the upstream got %+v after the switch", r)
	}
}

// TestProxyVMLargeDownload streams 1 GiB through the proxy and watches the
// proxy container's memory.
func TestProxyVMLargeDownload(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads 1 GiB through the proxy; skipped in -short mode")
	}
	t.Parallel()
	x := newPX(t)
	p := x.open(t, x.checkout(t, "pxbig", x.config("proxy", ""), nil), nil)
	x.create(t, p, sandbox.CreateOptions{})
	_, pvm := x.proxyVM(t, p)
	mem := x.memoryProbe(t, pvm.ID)
	if mem == nil {
		t.Skipf("cannot read the memory use of the proxy container %s (neither engine stats nor a local cgroup)", pvm.Name)
	}
	// One request first, so the connection and TLS state exist before the
	// baseline.
	if c := x.curl(t, p, `"https://`+x.up.host+`/bytes?n=1024"`); c.Code != 200 {
		t.Fatalf("warm-up download: %+v", c)
	}
	base := mem.read(t, true)
	var peak atomic.Uint64
	peak.Store(base.usage)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if m := mem.read(t, false); m.usage > peak.Load() {
					peak.Store(m.usage)
				}
			}
		}
	}()
	const size = 1 << 30
	start := time.Now()
	res := x.run(t, p, sandbox.ExecOptions{Cmd: []string{"sh", "-c",
		`curl -sS --max-time 600 -o /dev/null -w '%{http_code} %{size_download}' "https://` + x.up.host + `/bytes?n=` + strconv.Itoa(size) + `"`}})
	elapsed := time.Since(start)
	close(done)
	wg.Wait()
	end := mem.read(t, false)
	if want := fmt.Sprintf("200 %d", size); strings.TrimSpace(res.Stdout.Text) != want {
		t.Fatalf("download: %q (stderr %q), want %q", res.Stdout.Text, res.Stderr.Text, want)
	}
	const mib = 1 << 20
	t.Logf("1 GiB through the proxy in %s (%.0f MiB/s); proxy memory (%s): %.1f MiB before, sampled peak %.1f MiB, %.1f MiB after; recorded peak %.1f MiB before (reset: %v), %.1f MiB after",
		elapsed.Round(time.Millisecond), float64(size)/mib/elapsed.Seconds(), mem.source,
		float64(base.usage)/mib, float64(peak.Load())/mib, float64(end.usage)/mib, float64(base.peak)/mib, mem.resettable, float64(end.peak)/mib)
	const flat = 64 * mib // of 1024 MiB streamed
	if peak.Load() > base.usage+flat {
		t.Errorf("the proxy's memory grew from %d to %d bytes while streaming 1 GiB", base.usage, peak.Load())
	}
	if base.peak > 0 && end.peak > base.peak+flat {
		t.Errorf("the proxy's peak memory grew from %d to %d bytes while streaming 1 GiB", base.peak, end.peak)
	}
	var sent int64
	for _, r := range x.up.records(t) {
		if r.Kind == "bytes" && r.Bytes > sent {
			sent = r.Bytes
		}
	}
	if sent != size {
		t.Errorf("the upstream sent %d bytes, want %d", sent, size)
	}
}

// pxMemProbe reads a container's memory use: from the engine's stats, or,
// where the engine reports none (as Docker 20.10 may on cgroup v1), from
// the container's cgroup on this host.
type pxMemProbe struct {
	x          *pxEnv
	id         string
	source     string // "engine stats", or the cgroup directory
	dir        string
	v1         bool
	resettable bool
}

type pxMem struct{ usage, peak uint64 }

// memoryProbe returns a probe for container id, or nil when nothing can
// tell its memory use.
func (x *pxEnv) memoryProbe(t *testing.T, id string) *pxMemProbe {
	t.Helper()
	pr := &pxMemProbe{x: x, id: id, source: "engine stats"}
	if m := pr.stats(t); m.usage > 0 {
		return pr
	}
	for _, c := range []struct {
		dir string
		v1  bool
	}{
		{"/sys/fs/cgroup/memory/docker/" + id, true},
		{"/sys/fs/cgroup/memory/system.slice/docker-" + id + ".scope", true},
		{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope", false},
		{"/sys/fs/cgroup/docker/" + id, false},
	} {
		if _, err := os.Stat(c.dir); err == nil {
			pr.source, pr.dir, pr.v1 = "cgroup "+c.dir, c.dir, c.v1
			return pr
		}
	}
	return nil
}

func (pr *pxMemProbe) stats(t *testing.T) pxMem {
	res, err := pr.x.cli.ContainerStats(lcCtx(t), pr.id, client.ContainerStatsOptions{})
	if err != nil {
		return pxMem{}
	}
	defer res.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		return pxMem{}
	}
	return pxMem{usage: s.MemoryStats.Usage, peak: s.MemoryStats.MaxUsage}
}

// read returns the current and peak use; with reset it first resets the
// recorded peak where the cgroup allows it (v1).
func (pr *pxMemProbe) read(t *testing.T, reset bool) pxMem {
	if pr.dir == "" {
		return pr.stats(t)
	}
	num := func(name string) uint64 {
		b, err := os.ReadFile(filepath.Join(pr.dir, name))
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	if pr.v1 {
		if reset && os.WriteFile(filepath.Join(pr.dir, "memory.max_usage_in_bytes"), []byte("0"), 0o644) == nil {
			pr.resettable = true
		}
		return pxMem{usage: num("memory.usage_in_bytes"), peak: num("memory.max_usage_in_bytes")}
	}
	return pxMem{usage: num("memory.current"), peak: num("memory.peak")}
}

// TestProxyVMNoneMode: network.mode "none" gives the VM no network at all,
// and no proxy.
func TestProxyVMNoneMode(t *testing.T) {
	t.Parallel()
	x := newPX(t)
	p := x.open(t, x.checkout(t, "pxnone", x.config("none", ""), nil), nil)
	x.create(t, p, sandbox.CreateOptions{})
	if ifs := strings.Fields(x.sh(t, p, "ls /sys/class/net")); !slices.Equal(ifs, []string{"lo"}) {
		t.Errorf("interfaces in network mode none: %v, want only lo", ifs)
	}
	if routes := strings.Split(strings.TrimSpace(x.sh(t, p, "cat /proc/net/route")), "\n"); len(routes) != 1 {
		t.Errorf("routes in network mode none: %q, want none", routes)
	}
	c := x.curl(t, p, `--noproxy '*' --connect-timeout 4 "https://`+x.up.ip+`/echo?id=none"`)
	if c.Exit == 0 || c.Exit == 35 || c.Exit == 52 {
		t.Errorf("a connection to the upstream's address from a VM without network: %+v", c)
	}
	if env := x.sh(t, p, "env"); strings.Contains(strings.ToLower(env), "_proxy=") {
		t.Errorf("proxy variables in network mode none:\n%s", env)
	}
	if _, vm := x.proxyVM(t, p); vm.State != "" && vm.State != sandbox.VMMissing {
		t.Errorf("a proxy container exists in network mode none: %+v", vm)
	}
	if !strings.Contains(x.log.String(), `network.mode is \"none\"`) {
		t.Errorf("no warning that secrets are useless without network; log:\n%s", x.log.String())
	}
}

// TestProxyVMSecretHosts: a secret must name its hosts; with
// allow_any_host_dangerous it may go anywhere the policy allows, with a
// warning on every run.
func TestProxyVMSecretHosts(t *testing.T) {
	t.Parallel()
	x := newPX(t)
	noHosts := `agent = "shell"
[secrets.NOHOSTS]
from = "env:ASB_TEST_TOK"
`
	dir := x.checkout(t, "pxnohosts", noHosts, nil)
	_, err := x.m.Open(sandbox.OpenOptions{Dir: dir, Trust: true})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "secrets.NOHOSTS.hosts") || !strings.Contains(err.Error(), "allow_any_host_dangerous") {
		t.Errorf("Open with a secret without hosts: %v; want ErrInvalid naming secrets.NOHOSTS.hosts and the way out", err)
	}
	// The same through the secret_proxy operation.
	p0, err := x.m.Open(sandbox.OpenOptions{Dir: x.checkout(t, "pxset", "agent = \"shell\"\n", nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.m.SetSecret(lcCtx(t), p0, "NOHOSTS", sandbox.SecretConfig{From: "env:ASB_TEST_TOK"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("SetSecret without hosts: %v, want ErrInvalid", err)
	}

	anyHost := x.config("proxy", `[secrets.ANY]
from = "env:ASB_TEST_TOK"
allow_any_host_dangerous = true
`)
	p := x.open(t, x.checkout(t, "pxany", anyHost, nil), nil)
	x.create(t, p, sandbox.CreateOptions{})
	warning := "allow_any_host_dangerous: this secret may be sent"
	if n := strings.Count(x.log.String(), warning); n != 1 {
		t.Errorf("first run: %d warnings about %s, want 1; log:\n%s", n, warning, x.log.String())
	}
	again := x.create(t, p, sandbox.CreateOptions{})
	if again.Action != sandbox.VMReused {
		t.Errorf("second run: %s, want reused", again.Action)
	}
	if n := strings.Count(x.log.String(), warning); n != 2 {
		t.Errorf("after a second run: %d warnings about %s, want one per run", n, warning)
	}
	// ANY goes to the other host, which network.allow allows; TOK still not.
	c := x.curl(t, p, `-H "X-Any: $ANY" "https://`+x.up.other+`/echo?id=any"`)
	if c.Code != 200 {
		t.Fatalf("ANY to %s: %+v", x.up.other, c)
	}
	r := x.up.requests(t, "request", "any")
	if len(r) != 1 || !slices.Equal(r[0].Headers["X-Any"], []string{x.values["TOK"]}) {
		t.Errorf("ANY at %s: %+v; want its value", x.up.other, r)
	}
	if c := x.curl(t, p, `-H "X-Tok: $TOK" "https://`+x.up.other+`/echo?id=tok-other"`); c.Code != 403 {
		t.Errorf("TOK to %s next to an any-host secret: %+v, want 403", x.up.other, c)
	}
	// Still only where the policy allows (an address decided before any
	// dial: the proxy's own loopback).
	if c := x.curl(t, p, `--noproxy '' -H "X-Any: $ANY" "https://127.0.0.1/echo"`); c.Connect != 403 {
		t.Errorf("ANY to an address the policy does not allow: %+v, want 403 at CONNECT", c)
	}
}

// TestProxyVMOutlivesClient: the proxy is a container; it serves the VM
// after the agents-sandbox process that started it has exited, and stops
// with the VM.
func TestProxyVMOutlivesClient(t *testing.T) {
	t.Parallel()
	x := newPX(t)
	dir := x.checkout(t, "pxcli", x.config("proxy", ""), nil)
	p := x.open(t, dir, nil)
	cli := x.cliIn(t, dir)
	x.warmCache(t)
	if _, stderr, err := cli("create", "--trust"); err != nil {
		t.Fatalf("agents-sandbox create: %v\n%s", err, stderr)
	}
	// That process has exited; the proxy runs on.
	name, vm := x.proxyVM(t, p)
	if vm.State != sandbox.VMRunning {
		t.Fatalf("proxy %s after the client exited: %s, want running", name, vm.State)
	}
	out, stderr, err := x.runCLIExec(cli, `curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOK" "https://`+x.up.host+`/echo?id=cli"`)
	if err != nil || out != "200" {
		t.Errorf("request through the proxy from `agents-sandbox exec`: %q, %v\n%s", out, err, stderr)
	}
	if r := x.up.requests(t, "request", "cli"); len(r) != 1 || !slices.Equal(r[0].Headers["Authorization"], []string{"Bearer " + x.values["TOK"]}) {
		t.Errorf("the upstream got %+v, want the real value", r)
	}
	out, stderr, err = cli("proxy", "audit", "--json")
	if err != nil {
		t.Fatalf("proxy audit --json: %v\n%s", err, stderr)
	}
	var audit struct {
		Items []proxy.AuditEvent `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &audit); err != nil {
		t.Fatalf("proxy audit --json printed %q: %v", out, err)
	}
	if _, ok := pxFindEvent(audit.Items, proxy.AuditEvent{Action: proxy.ActionSubstituted, Secret: "TOK", Host: x.up.host}); !ok {
		t.Errorf("`proxy audit` shows no substitution of TOK: %+v", audit.Items)
	}
	for _, v := range x.values {
		if strings.Contains(out+stderr, v) {
			t.Errorf("`proxy audit` printed a secret value")
		}
	}
	// It stops with the VM.
	if _, err := x.m.Stop(lcCtx(t), p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, vm := x.proxyVM(t, p); vm.State == sandbox.VMRunning {
		t.Errorf("proxy after Stop: %s, want stopped", vm.State)
	}
}

// cliIn returns a function that runs the agents-sandbox binary in dir with
// the Manager's environment (secret sources included) and the test's XDG
// directories, and returns its stdout, stderr and error.
func (x *pxEnv) cliIn(t *testing.T, dir string) func(args ...string) (string, string, error) {
	bin := testbin.Path(t)
	return func(args ...string) (string, string, error) {
		cmd := exec.CommandContext(lcCtx(t), bin, args...)
		cmd.Dir = dir
		cmd.Env = append(slices.Clone(x.m.Environ),
			"XDG_CONFIG_HOME="+x.xdg.config, "XDG_STATE_HOME="+x.xdg.state, "XDG_CACHE_HOME="+x.xdg.cache)
		if h := os.Getenv("DOCKER_HOST"); h != "" {
			cmd.Env = append(cmd.Env, "DOCKER_HOST="+h)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
}

// runCLIExec runs a shell script in the VM through `agents-sandbox exec`.
func (x *pxEnv) runCLIExec(cli func(...string) (string, string, error), script string) (string, string, error) {
	return cli("exec", "--", "sh", "-c", script)
}
