package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agents-sandbox/agents-sandbox/proxy"
)

// loopbackAllow is the only egress the benchmark's proxies get.
var loopbackAllow = []string{"127.0.0.1/32"}

// loopbackDialer refuses, without dialing, any address outside loopback.
type loopbackDialer struct{}

func (loopbackDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("bench dialer: refusing non-loopback address %s", address)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// upstream is the loopback HTTPS server both sides talk to.
type upstream struct {
	srv  *httptest.Server
	base string // https://127.0.0.1:PORT
	pool *x509.CertPool

	held    atomic.Int64
	arrived chan struct{} // one value per /hold request
	release chan struct{} // closed to answer the held requests
}

func startUpstream() *upstream {
	u := &upstream{arrived: make(chan struct{}, 10000), release: make(chan struct{})}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/download", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			c := min(n, int64(len(buf)))
			if _, err := w.Write(buf[:c]); err != nil {
				return
			}
			n -= c
		}
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, strconv.FormatInt(n, 10))
	})
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		u.held.Add(1)
		u.arrived <- struct{}{}
		select {
		case <-u.release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	u.srv = httptest.NewUnstartedServer(mux)
	u.srv.EnableHTTP2 = false
	u.srv.StartTLS() // listens on 127.0.0.1
	u.base = u.srv.URL
	u.pool = x509.NewCertPool()
	u.pool.AddCert(u.srv.Certificate())
	return u
}

func (u *upstream) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
}

// proxySetup is an in-process proxy in front of an upstream, and the two
// clients: through the proxy and direct.
type proxySetup struct {
	up      *upstream
	srv     *proxy.Server
	secret  proxy.Secret
	direct  *http.Client
	proxied *http.Client
	close   func()
}

func benchSecret() proxy.Secret {
	return proxy.Secret{
		Name:        "BENCH_TOKEN",
		Value:       proxy.NewSecretValue("bench-real-value-" + newRunID()),
		Placeholder: proxy.NewPlaceholder("BENCH_TOKEN"),
		Hosts:       loopbackAllow,
	}
}

func newProxySetup(e *Env, name string) (*proxySetup, error) {
	up := startUpstream()
	ca, err := proxy.LoadOrCreateCA(filepath.Join(e.Root, "ca-"+name))
	if err != nil {
		up.srv.Close()
		return nil, err
	}
	sec := benchSecret()
	token := newRunID() + newRunID()
	srv, err := proxy.New(proxy.Options{
		VM: "bench", CA: ca, Secrets: []proxy.Secret{sec},
		Policy: proxy.Policy{Mode: proxy.ModeProxy, Allow: loopbackAllow},
		Token:  token, UpstreamRootCAs: up.pool, Dialer: loopbackDialer{},
	})
	if err != nil {
		up.srv.Close()
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		up.srv.Close()
		return nil, err
	}
	go func() { _ = srv.Serve(l) }()
	purl := &url.URL{Scheme: "http", User: url.UserPassword("bench", token), Host: l.Addr().String()}
	ps := &proxySetup{
		up: up, srv: srv, secret: sec,
		direct:  &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: loopbackDialer{}.DialContext, TLSClientConfig: &tls.Config{RootCAs: up.pool}, MaxIdleConnsPerHost: 4}},
		proxied: &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(purl), DialContext: loopbackDialer{}.DialContext, TLSClientConfig: &tls.Config{RootCAs: ca.CertPool()}, MaxIdleConnsPerHost: 4}},
	}
	ps.close = func() {
		_ = srv.Close()
		up.srv.Close()
	}
	return ps, nil
}

// get requests path with the secret's placeholder in Authorization (the
// proxy substitutes it; the direct request carries it as is) and reads the
// whole body. It returns the body length.
func (ps *proxySetup) do(ctx context.Context, c *http.Client, method, path string, body io.Reader, n int64) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, method, ps.up.base+path, body)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.ContentLength = n
	}
	req.Header.Set("Authorization", "Bearer "+ps.secret.Placeholder)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return got, err
	}
	if resp.StatusCode != http.StatusOK {
		return got, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return got, nil
}

// Row 8: added latency per request.
func runProxyLatency(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	ps, err := newProxySetup(e, "latency")
	if err != nil {
		return nil, err
	}
	defer ps.close()
	one := func(c *http.Client) func() error {
		return func() error {
			n, err := ps.do(ctx, c, http.MethodGet, "/small", nil, 0)
			if err == nil && n != 3 {
				err = fmt.Errorf("got %d bytes, want 3", n)
			}
			return err
		}
	}
	o, b, err := interleave(f.requests, 20, one(ps.proxied), one(ps.direct))
	if err != nil {
		return nil, err
	}
	rows := latencyRows("8a", "HTTPS GET through the secret proxy (substituting a header) vs direct, keep-alive", "proxy.Server in-process, TLS intercepted, placeholder substituted", "the same client straight to the loopback HTTPS server", o, b)
	sub := 0
	for _, ev := range ps.srv.Audit(0) {
		if ev.Action == proxy.ActionSubstituted {
			sub++
		}
	}
	so, sb := summarize(o), summarize(b)
	for i := range rows {
		rows[i].PeakRSSMiB, rows[i].RSSSource = selfPeakMiB(), "VmHWM of the row's child process (proxy, upstream server and both clients in one process)"
	}
	rows[0].Notes = append(rows[0].Notes, fmt.Sprintf("added latency: p50 %.3f ms, p99 %.3f ms", so.Median-sb.Median, so.P99-sb.P99), fmt.Sprintf("substitution audit events in the ring: %d", sub))
	return rows, nil
}

// repeatReader yields n bytes of a repeating pattern.
type repeatReader struct {
	n   int64
	buf []byte
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	c := copy(p, r.buf)
	if int64(c) > r.n {
		c = int(r.n)
	}
	r.n -= int64(c)
	return c, nil
}

// Row 8: 1 GiB download and upload throughput.
func runProxyTransfer(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	ps, err := newProxySetup(e, "transfer")
	if err != nil {
		return nil, err
	}
	defer ps.close()
	pattern := make([]byte, 1<<20)
	for i := range pattern {
		pattern[i] = byte('A' + i%26)
	}
	download := func(c *http.Client) func() (float64, error) {
		return func() (float64, error) {
			t := time.Now()
			n, err := ps.do(ctx, c, http.MethodGet, "/download?bytes="+strconv.FormatInt(f.transfer, 10), nil, 0)
			d := time.Since(t)
			if err == nil && n != f.transfer {
				err = fmt.Errorf("downloaded %d bytes, want %d", n, f.transfer)
			}
			return mbps(f.transfer, d), err
		}
	}
	upload := func(c *http.Client) func() (float64, error) {
		return func() (float64, error) {
			t := time.Now()
			_, err := ps.do(ctx, c, http.MethodPost, "/upload", &repeatReader{n: f.transfer, buf: pattern}, f.transfer)
			return mbps(f.transfer, time.Since(t)), err
		}
	}
	var rows []Row
	for _, k := range []struct {
		id, what string
		fn       func(*http.Client) func() (float64, error)
	}{{"8b", "download", download}, {"8c", "upload", upload}} {
		var o, b []float64
		for i := 0; i < f.nTransfer; i++ {
			x, err := k.fn(ps.proxied)()
			if err != nil {
				return nil, fmt.Errorf("%s run %d (ours): %w", k.what, i, err)
			}
			y, err := k.fn(ps.direct)()
			if err != nil {
				return nil, fmt.Errorf("%s run %d (direct): %w", k.what, i, err)
			}
			o, b = append(o, x), append(b, y)
		}
		r := pair(k.id, fmt.Sprintf("HTTPS %s of %s through the secret proxy vs direct", k.what, sizeName(f.transfer)), "proxy.Server in-process, TLS intercepted, placeholder substituted in a header", "the same client straight to the loopback HTTPS server", "MB/s", "higher", o, b)
		rows = append(rows, r)
	}
	for i := range rows {
		rows[i].PeakRSSMiB, rows[i].RSSSource = selfPeakMiB(), "VmHWM of the row's child process (proxy, upstream server and both clients in one process)"
	}
	return rows, nil
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Row 9: the proxy as its own process (`agents-sandbox proxy serve`, what
// the proxy container runs) holding f.conns requests in flight.
func runMemProxy(ctx context.Context, e *Env, f *flags) ([]Row, error) {
	up := startUpstream()
	defer up.srv.Close()
	dir := filepath.Join(e.Root, "ca-mem")
	ca, err := proxy.LoadOrCreateCA(dir)
	if err != nil {
		return nil, err
	}
	upCA := filepath.Join(dir, "upstream.pem")
	if err := os.WriteFile(upCA, up.certPEM(), 0o600); err != nil {
		return nil, err
	}
	sec := benchSecret()
	token := newRunID() + newRunID()
	cfg := proxy.Config{
		Listen: "127.0.0.1:0", VM: "bench",
		CACert: filepath.Join(dir, proxy.CACertFile), CAKey: filepath.Join(dir, proxy.CAKeyFile),
		Token: token, Secrets: []proxy.Secret{sec},
		Policy:          proxy.Policy{Mode: proxy.ModeProxy, Allow: loopbackAllow},
		UpstreamCAFiles: []string{upCA}, LogLevel: "info",
	}
	cfgFile := filepath.Join(dir, "proxy.json")
	fh, err := os.OpenFile(cfgFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	err = proxy.EncodeConfig(fh, cfg)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}

	cmd := exec.CommandContext(ctx, e.Bin, "proxy", "serve", "--config", cfgFile)
	cmd.Env = e.environ()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	waitc := make(chan error, 1)
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			var l struct {
				Msg  string `json:"message"`
				Addr string `json:"addr"`
			}
			if !sent && json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "proxy listening" && l.Addr != "" {
				addrc <- l.Addr
				sent = true
			}
		}
		waitc <- cmd.Wait()
	}()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-waitc:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-waitc
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-waitc:
		return nil, fmt.Errorf("proxy exited before listening: %v", err)
	case <-time.After(30 * time.Second):
		return nil, errors.New("proxy did not say where it listens within 30 s")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	idle, err := readProcMem(pid)
	if err != nil {
		return nil, err
	}

	purl := &url.URL{Scheme: "http", User: url.UserPassword("bench", token), Host: addr}
	var wg sync.WaitGroup
	errs := make([]error, f.conns)
	for i := range f.conns {
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(purl), DialContext: loopbackDialer{}.DialContext, TLSClientConfig: &tls.Config{RootCAs: ca.CertPool()}}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.CloseIdleConnections()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.base+"/hold", nil)
			if err != nil {
				errs[i] = err
				return
			}
			req.Header.Set("Authorization", "Bearer "+sec.Placeholder)
			resp, err := c.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				errs[i] = fmt.Errorf("hold: %s", resp.Status)
			}
		}()
	}
	// Wait until every request is held at the upstream: then each has its
	// own client connection, tunnel, TLS session and upstream connection.
	timeout := time.After(60 * time.Second)
	for n := 0; n < f.conns; n++ {
		select {
		case <-up.arrived:
		case <-timeout:
			close(up.release)
			wg.Wait()
			return nil, fmt.Errorf("only %d of %d requests reached the upstream in 60 s: %w", n, f.conns, errors.Join(errs...))
		}
	}
	loaded, err := readProcMem(pid)
	close(up.release)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r := Row{ID: "9b", Operation: fmt.Sprintf("RSS of the proxy process with %d concurrent connections (requests in flight)", f.conns),
		Ours:     fmt.Sprintf("VmRSS of `agents-sandbox proxy serve` while %d intercepted HTTPS requests are held open upstream", f.conns),
		Baseline: "VmRSS of the same proxy process idle, before the connections",
		Unit:     "MiB", Figure: "single", Better: "lower", OursValue: mib(loaded.RSS), BaseValue: mib(idle.RSS)}
	r.Ratio = ratio(r.OursValue, r.BaseValue)
	r.PeakRSSMiB, r.RSSSource = mib(loaded.HWM), "VmHWM of the `agents-sandbox proxy serve` process"
	r.Notes = append(r.Notes, fmt.Sprintf("%.1f KiB per connection", float64(loaded.RSS-idle.RSS)/1024/float64(f.conns)))
	return []Row{r}, nil
}
