package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// testTimeout guards every wait in these tests: reaching it is a failure, never the expected path.
const testTimeout = 30 * time.Second

// mapResolver resolves names from a fixed table, as a test hook for Options.Resolver.
type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _ string, host string) ([]netip.Addr, error) {
	if ips, ok := m[normalizeHost(host)]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// loopbackDialer records every address it is asked to dial and refuses, without dialing, any
// address outside loopback: the tests can never open a connection anywhere else.
type loopbackDialer struct {
	mu    sync.Mutex
	addrs []string
}

func (d *loopbackDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, address)
	d.mu.Unlock()
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("test dialer: refusing non-loopback address %s", address)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, address)
}

func (d *loopbackDialer) dialed() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.addrs...)
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (log capture).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// recorded is what the test upstream saw of one request.
type recorded struct {
	Proto  string
	Host   string
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   string
}

// upstream is a test HTTPS (or HTTP) server on loopback that records requests.
type upstream struct {
	srv  *httptest.Server
	port string
	mu   sync.Mutex
	reqs []recorded
}

func (u *upstream) requests() []recorded {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]recorded(nil), u.reqs...)
}

// record wraps h to record each request (reading the body first unless stream is set).
func (u *upstream) record(h http.HandlerFunc, readBody bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := recorded{Proto: r.Proto, Host: r.Host, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone()}
		if readBody {
			b, _ := io.ReadAll(r.Body)
			rec.Body = string(b)
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		u.mu.Lock()
		u.reqs = append(u.reqs, rec)
		u.mu.Unlock()
		if h != nil {
			h(w, r)
		}
	}
}

// upstreamCA signs the test upstreams' certificates; the proxy trusts it via UpstreamRootCAs.
type testEnv struct {
	t          *testing.T
	upstreamCA *CA
	ca         *CA // the proxy's interception CA
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	uca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{t: t, upstreamCA: uca, ca: ca}
}

// startUpstream starts a recording HTTPS server on 127.0.0.1 presenting certificates of the
// upstream CA for any SNI; h2 enables HTTP/2.
func (e *testEnv) startUpstream(h http.HandlerFunc, readBody, h2 bool) *upstream {
	e.t.Helper()
	u := &upstream{}
	srv := httptest.NewUnstartedServer(u.record(h, readBody))
	ipCert, err := e.upstreamCA.LeafCertificate("127.0.0.1")
	if err != nil {
		e.t.Fatal(err)
	}
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{*ipCert},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return e.upstreamCA.LeafCertificate(hello.ServerName)
		},
	}
	srv.EnableHTTP2 = h2
	srv.StartTLS()
	e.t.Cleanup(srv.Close)
	u.srv = srv
	_, u.port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return u
}

// startPlainUpstream starts a recording plain-HTTP server on 127.0.0.1.
func (e *testEnv) startPlainUpstream(h http.HandlerFunc) *upstream {
	e.t.Helper()
	u := &upstream{}
	srv := httptest.NewServer(u.record(h, true))
	e.t.Cleanup(srv.Close)
	u.srv = srv
	_, u.port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return u
}

const testToken = "proxy-token-for-tests"

// testProxy is a running Server with its address, logs and dial record.
type testProxy struct {
	srv    *Server
	addr   string
	logs   *syncBuffer
	dialer *loopbackDialer
	opts   Options
}

// loopback is the resolver table of the tests: every name below .test is 127.0.0.1 unless
// overridden.
func loopback(names ...string) mapResolver {
	m := mapResolver{}
	for _, n := range names {
		m[n] = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	return m
}

// startProxy starts a proxy on 127.0.0.1 with opts completed by the env's CA, the upstream CA, a
// debug logger into a buffer, the loopback-only dialer and the token.
func (e *testEnv) startProxy(opts Options) *testProxy {
	e.t.Helper()
	p := &testProxy{logs: &syncBuffer{}, dialer: &loopbackDialer{}}
	opts.CA = e.ca
	opts.UpstreamRootCAs = e.upstreamCA.CertPool()
	opts.Logger = zerolog.New(p.logs).Level(zerolog.DebugLevel)
	opts.Dialer = p.dialer
	if opts.Token == "" {
		opts.Token = testToken
	}
	if opts.VM == "" {
		opts.VM = "test-vm"
	}
	srv, err := New(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	e.t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; err != nil {
			e.t.Errorf("serve: %v", err)
		}
	})
	p.srv, p.addr, p.opts = srv, l.Addr().String(), opts
	return p
}

// client returns an HTTP client using the proxy with its credential and trusting the proxy's CA.
func (p *testProxy) client(e *testEnv, h2 bool) *http.Client {
	u := &url.URL{Scheme: "http", Host: p.addr, User: url.UserPassword("vm", p.opts.Token)}
	tr := &http.Transport{
		Proxy:              http.ProxyURL(u),
		TLSClientConfig:    &tls.Config{RootCAs: e.ca.CertPool()},
		ForceAttemptHTTP2:  h2,
		DisableCompression: true,
	}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 2 * testTimeout}
}

func basicAuth(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// connect opens a raw tunnel: CONNECT target through the proxy with the given credential,
// returning the connection after the proxy's 200, or the response when it is not 200.
func (p *testProxy) connect(t *testing.T, target, token string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	auth := ""
	if token != "" {
		auth = "Proxy-Authorization: " + basicAuth("vm", token) + "\r\n"
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, auth)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("read CONNECT response: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, resp
	}
	if br.Buffered() > 0 {
		t.Fatalf("unexpected bytes after CONNECT response")
	}
	return c, resp
}

// tlsTunnel opens a tunnel to target and completes a TLS handshake with sni, trusting the proxy CA.
func (p *testProxy) tlsTunnel(t *testing.T, e *testEnv, target, sni string) (*tls.Conn, error) {
	t.Helper()
	c, resp := p.connect(t, target, p.opts.Token)
	if c == nil {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: e.ca.CertPool(), NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	return tc, nil
}

// rawRequest writes a raw HTTP/1.1 request on c and reads the response with its body.
func rawRequest(t *testing.T, c net.Conn, raw string) (*http.Response, string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// waitChan waits for ch or fails after testTimeout.
func waitChan[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// auditHas reports whether the proxy recorded an event with the action and secret for host.
func auditHas(events []AuditEvent, a Action, secret, host string) bool {
	for _, e := range events {
		if e.Action == a && e.Secret == secret && e.Host == host {
			return true
		}
	}
	return false
}

func mustGet(t *testing.T, c *http.Client, u string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", u, err)
	}
	return resp, string(b)
}

func containsAnyOf(s string, subs ...string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}
