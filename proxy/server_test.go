package proxy

import (
	"bufio"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/net/http2"
)

// The value contains characters that need escaping in a query and in a path.
const tokenValue = "ghp_Real/Value+with=chars&x!"

func githubSecret(hosts ...string) Secret {
	return Secret{
		Name:        "GITHUB_TOKEN",
		Value:       NewSecretValue(tokenValue),
		Placeholder: NewPlaceholder("GITHUB_TOKEN"),
		Hosts:       hosts,
	}
}

// Allow "127.0.0.1/32" is the explicit test hook that lets the proxy reach its loopback upstreams.
var loopbackAllow = []string{"127.0.0.1/32"}

func TestSubstitutionReachesAllowedHost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	sec := githubSecret("api.test")
	p := e.startProxy(Options{
		Secrets:  []Secret{sec},
		Policy:   Policy{Allow: loopbackAllow},
		Resolver: loopback("api.test"),
	})
	c := p.client(e, false)

	u := fmt.Sprintf("https://API.test:%s/repos/x?token=%s&keep=1", up.port, sec.Placeholder)
	resp, _ := mustGet(t, c, u, http.Header{
		"X-Api-Key":     {"token " + sec.Placeholder},
		"Authorization": {basicAuth("x-access-token", sec.Placeholder)},
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if got := r.Header.Get("X-Api-Key"); got != "token "+tokenValue {
		t.Errorf("X-Api-Key = %q, want the real value", got)
	}
	q, _ := url.ParseQuery(r.Query)
	if q.Get("token") != tokenValue || q.Get("keep") != "1" {
		t.Errorf("query = %q, want token=<real value>&keep=1", r.Query)
	}
	hr := &http.Request{Header: r.Header}
	user, pass, ok := hr.BasicAuth()
	if !ok || user != "x-access-token" || pass != tokenValue {
		t.Errorf("Basic credential = %q/%v, want x-access-token:<real value>", user, ok)
	}
	if r.Header.Get("Proxy-Authorization") != "" {
		t.Errorf("Proxy-Authorization forwarded upstream")
	}
	if !auditHas(p.srv.Audit(0), ActionSubstituted, "GITHUB_TOKEN", "api.test") {
		t.Errorf("no substituted audit event: %+v", p.srv.Audit(0))
	}
}

func TestPlaceholderToOtherHostIsBlocked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	sec := githubSecret("api.test")
	auditPath := filepath.Join(t.TempDir(), "audit", "audit.jsonl")
	p := e.startProxy(Options{
		Secrets:  []Secret{sec},
		Policy:   Policy{Allow: append([]string{"other.test"}, loopbackAllow...)},
		Resolver: loopback("api.test", "other.test"),
		AuditLog: auditPath,
	})
	c := p.client(e, false)

	for name, hdr := range map[string]http.Header{
		"header": {"Authorization": {"Bearer " + sec.Placeholder}},
		"basic":  {"Authorization": {basicAuth("u", sec.Placeholder)}},
		"query":  nil,
	} {
		u := fmt.Sprintf("https://other.test:%s/exfil", up.port)
		if hdr == nil {
			u += "?q=" + sec.Placeholder
		}
		resp, body := mustGet(t, c, u, hdr)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%s: status %s, want 403", name, resp.Status)
		}
		if !strings.Contains(body, "GITHUB_TOKEN") || !strings.Contains(body, "other.test") {
			t.Errorf("%s: 403 body does not name the secret and host: %q", name, body)
		}
		if strings.Contains(body, tokenValue) {
			t.Fatalf("%s: 403 body holds the value", name)
		}
	}
	// Without a placeholder the same host is reachable: only the secret is blocked.
	if resp, _ := mustGet(t, c, fmt.Sprintf("https://other.test:%s/fine", up.port), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("plain request to other.test: %s", resp.Status)
	}
	for _, r := range up.requests() {
		if r.Path != "/fine" {
			t.Errorf("upstream saw blocked request %s", r.Path)
		}
	}
	if !auditHas(p.srv.Audit(0), ActionBlocked, "GITHUB_TOKEN", "other.test") {
		t.Errorf("no blocked audit event: %+v", p.srv.Audit(0))
	}
	fileEvents, err := ReadAuditLog(auditPath, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !auditHas(fileEvents, ActionBlocked, "GITHUB_TOKEN", "other.test") {
		t.Errorf("audit log file lacks the blocked event: %+v", fileEvents)
	}
	for _, ev := range fileEvents {
		if ev.VM != "test-vm" {
			t.Errorf("audit event VM = %q", ev.VM)
		}
	}
}

func TestInnerHostMismatchIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	sec := githubSecret("api.test", "other.test")
	p := e.startProxy(Options{
		Secrets:  []Secret{sec},
		Policy:   Policy{Allow: loopbackAllow},
		Resolver: loopback("api.test", "other.test"),
	})
	target := "api.test:" + up.port
	cases := map[string]string{
		"other host, no placeholder": "GET / HTTP/1.1\r\nHost: other.test:" + up.port + "\r\n\r\n",
		"other host, placeholder":    "GET / HTTP/1.1\r\nHost: other.test:" + up.port + "\r\nAuthorization: Bearer " + sec.Placeholder + "\r\n\r\n",
		"other port":                 "GET / HTTP/1.1\r\nHost: api.test:1\r\n\r\n",
		"default port":               "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"absolute URL elsewhere":     "GET https://other.test:" + up.port + "/ HTTP/1.1\r\nHost: api.test:" + up.port + "\r\n\r\n",
	}
	for name, raw := range cases {
		tc, err := p.tlsTunnel(t, e, target, "api.test")
		if err != nil {
			t.Fatalf("%s: handshake: %v", name, err)
		}
		resp, body := rawRequest(t, tc, raw)
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("%s: status %s, want 421 (%s)", name, resp.Status, body)
		}
		if strings.Contains(body, tokenValue) {
			t.Fatalf("%s: response holds the value", name)
		}
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream saw %d requests, want none", n)
	}
	var refused int
	for _, ev := range p.srv.Audit(0) {
		if ev.Action == ActionRefused && ev.Host == "api.test" {
			refused++
		}
	}
	if refused != len(cases) {
		t.Errorf("%d refused audit events, want %d: %+v", refused, len(cases), p.srv.Audit(0))
	}
	// The matching Host on the same kind of tunnel goes through.
	tc, err := p.tlsTunnel(t, e, target, "api.test")
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := rawRequest(t, tc, "GET /ok HTTP/1.1\r\nHost: API.test.:"+up.port+"\r\nAuthorization: Bearer "+sec.Placeholder+"\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("matching host: %s", resp.Status)
	}
	if got := up.requests()[0].Header.Get("Authorization"); got != "Bearer "+tokenValue {
		t.Errorf("matching host: Authorization = %q", got)
	}
}

func TestSNIMismatchIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	p := e.startProxy(Options{
		Secrets:  []Secret{githubSecret("api.test", "other.test")},
		Policy:   Policy{Allow: loopbackAllow},
		Resolver: loopback("api.test", "other.test"),
	})
	for _, sni := range []string{"other.test", "", "api.test.evil"} {
		if _, err := p.tlsTunnel(t, e, "api.test:"+up.port, sni); err == nil {
			t.Errorf("SNI %q: handshake succeeded, want failure", sni)
		}
	}
	found := 0
	for _, ev := range p.srv.Audit(0) {
		if ev.Action == ActionRefused && ev.Host == "api.test" && strings.Contains(ev.Reason, "SNI") {
			found++
		}
	}
	// An empty SNI fails on the client side (Go refuses to verify without a name) or on ours.
	if found < 2 {
		t.Errorf("%d SNI refusals audited, want at least 2: %+v", found, p.srv.Audit(0))
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

func TestProxyCredentialRequired(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startPlainUpstream(nil)
	p := e.startProxy(Options{Policy: Policy{Allow: append([]string{"plain.test"}, loopbackAllow...)}, Resolver: loopback("plain.test")})

	for _, token := range []string{"", "wrong"} {
		_, resp := p.connect(t, "plain.test:"+up.port, token)
		if resp.StatusCode != http.StatusProxyAuthRequired || resp.Header.Get("Proxy-Authenticate") == "" {
			t.Errorf("CONNECT with token %q: %s, want 407 with Proxy-Authenticate", token, resp.Status)
		}
	}
	noAuth := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: p.addr})}}
	resp, _ := mustGet(t, noAuth, "http://plain.test:"+up.port+"/", nil)
	if resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("plain request without credential: %s, want 407", resp.Status)
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("upstream saw %d requests without credential", n)
	}
	// With the credential, plain HTTP goes through and Proxy-Authorization stays here.
	resp, _ = mustGet(t, p.client(e, false), "http://plain.test:"+up.port+"/x", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with credential: %s", resp.Status)
	}
	if r := up.requests(); len(r) != 1 || r[0].Header.Get("Proxy-Authorization") != "" {
		t.Errorf("upstream requests %+v: want one, without Proxy-Authorization", r)
	}
}

func TestPlainHTTPSubstitution(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startPlainUpstream(nil)
	sec := githubSecret("plain.test")
	p := e.startProxy(Options{
		Secrets:  []Secret{sec},
		Policy:   Policy{Allow: append([]string{"elsewhere.test"}, loopbackAllow...)},
		Resolver: loopback("plain.test", "elsewhere.test"),
	})
	c := p.client(e, false)
	hdr := http.Header{"Authorization": {"Bearer " + sec.Placeholder}}
	if resp, _ := mustGet(t, c, "http://plain.test:"+up.port+"/a", hdr); resp.StatusCode != http.StatusOK {
		t.Fatalf("allowed: %s", resp.Status)
	}
	if resp, _ := mustGet(t, c, "http://elsewhere.test:"+up.port+"/b", hdr); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("not allowed: %s, want 403", resp.Status)
	}
	reqs := up.requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer "+tokenValue {
		t.Fatalf("upstream requests %+v: want one with the real value", reqs)
	}
}

func TestBodySubstitution(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	got := make(chan struct{}, 1)
	var bodies = make(chan string, 4)
	up := e.startUpstream(func(w http.ResponseWriter, r *http.Request) {
		// Read the first part, signal, then the rest: the proxy must stream, not buffer.
		br := bufio.NewReader(r.Body)
		head := make([]byte, 4)
		if _, err := io.ReadFull(br, head); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		got <- struct{}{}
		rest, _ := io.ReadAll(br)
		bodies <- string(head) + string(rest)
	}, false, false)
	withBody := githubSecret("api.test")
	withBody.Body = true
	noBody := Secret{Name: "NPM_TOKEN", Value: NewSecretValue("npm-real-value"), Placeholder: NewPlaceholder("NPM_TOKEN"), Hosts: []string{"api.test"}}
	p := e.startProxy(Options{
		Secrets:  []Secret{withBody, noBody},
		Policy:   Policy{Allow: loopbackAllow},
		Resolver: loopback("api.test"),
	})
	c := p.client(e, false)

	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, "https://api.test:"+up.port+"/upload", pr)
	respc := make(chan *http.Response, 1)
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err != nil {
			errc <- err
			return
		}
		respc <- resp
	}()
	ph := withBody.Placeholder
	// The split inside the placeholder is only written after the upstream got "AAAA", so the
	// proxy sees the placeholder across two reads.
	if _, err := io.WriteString(pw, "AAAA"+ph[:10]); err != nil {
		t.Fatal(err)
	}
	waitChan(t, got, "the first body bytes upstream")
	if _, err := io.WriteString(pw, ph[10:]+" and "+noBody.Placeholder+" BBBB"); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	select {
	case err := <-errc:
		t.Fatal(err)
	case resp := <-respc:
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %s", resp.Status)
		}
	}
	body := waitChan(t, bodies, "the upstream body")
	want := "AAAA" + tokenValue + " and " + noBody.Placeholder + " BBBB"
	if body != want {
		t.Errorf("upstream body = %q, want %q (Body secret replaced, the other untouched)", body, want)
	}
}

func TestBodyPlaceholderToOtherHostIsBlocked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	here := githubSecret("api.test")
	here.Body = true
	elsewhere := Secret{Name: "OTHER", Value: NewSecretValue("other-real-value"), Placeholder: NewPlaceholder("OTHER"), Hosts: []string{"other.test"}, Body: true}
	p := e.startProxy(Options{
		Secrets:  []Secret{here, elsewhere},
		Policy:   Policy{Allow: loopbackAllow},
		Resolver: loopback("api.test", "other.test", "third.test"),
	})
	c := p.client(e, false)
	// api.test's bodies are scanned (GITHUB_TOKEN may go there): OTHER's placeholder stops it.
	resp, err := c.Post("https://api.test:"+up.port+"/x", "text/plain", strings.NewReader("a="+here.Placeholder+"&b="+elsewhere.Placeholder))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "OTHER") {
		t.Errorf("status %s %q, want 403 naming OTHER", resp.Status, body)
	}
	// third.test may receive no body secret: its body is not touched, placeholders stay.
	resp, err = c.Post("https://third.test:"+up.port+"/y", "text/plain", strings.NewReader("a="+here.Placeholder))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("third.test: %s", resp.Status)
	}
	for _, r := range up.requests() {
		// (/x may have got the start of the body, with GITHUB_TOKEN's value: api.test may have it.)
		if strings.Contains(r.Body, "other-real-value") || r.Path == "/y" && strings.Contains(r.Body, tokenValue) {
			t.Fatalf("upstream %s got a value it may not have: %q", r.Path, r.Body)
		}
		if r.Path == "/y" && (r.Body != "a="+here.Placeholder || r.Header.Get("Content-Length") == "") {
			t.Errorf("untouched body changed: %q, Content-Length %q", r.Body, r.Header.Get("Content-Length"))
		}
	}
	if !auditHas(p.srv.Audit(0), ActionBlocked, "OTHER", "api.test") {
		t.Errorf("no blocked event: %+v", p.srv.Audit(0))
	}
}

func TestEchoedValueIsMasked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	}, true, false)
	sec := githubSecret("api.test")
	p := e.startProxy(Options{Secrets: []Secret{sec}, Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("api.test")})
	resp, body := mustGet(t, p.client(e, false), "https://api.test:"+up.port+"/", http.Header{"Authorization": {"Bearer " + sec.Placeholder}})
	if strings.Contains(body, tokenValue) || strings.Contains(resp.Header.Get("X-Echo"), tokenValue) {
		t.Fatalf("echoed value reached the client: %q / %q", body, resp.Header.Get("X-Echo"))
	}
	if body != "you sent Bearer "+sec.Placeholder {
		t.Errorf("body = %q, want the placeholder back", body)
	}
	if up.requests()[0].Header.Get("Authorization") != "Bearer "+tokenValue {
		t.Errorf("upstream did not get the value")
	}
}

func TestSSEStreamsEventByEvent(t *testing.T) {
	t.Parallel()
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("client-h2=%v", h2), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			release := make(chan struct{})
			up := e.startUpstream(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "data: first\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				fmt.Fprint(w, "data: second\n\n")
			}, true, true)
			sec := githubSecret("api.test")
			p := e.startProxy(Options{Secrets: []Secret{sec}, Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("api.test")})
			req, _ := http.NewRequest(http.MethodGet, "https://api.test:"+up.port+"/events", nil)
			// A substituted secret also puts the response through the masking reader.
			req.Header.Set("Authorization", "Bearer "+sec.Placeholder)
			resp, err := p.client(e, h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if h2 && resp.ProtoMajor != 2 {
				t.Errorf("client-proxy protocol %s, want HTTP/2", resp.Proto)
			}
			lines := make(chan string)
			go func() {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			if l := waitChan(t, lines, "the first event while the upstream holds the stream open"); l != "data: first" {
				t.Fatalf("first line %q", l)
			}
			close(release)
			var rest []string
			for l := range lines {
				rest = append(rest, l)
			}
			if !strings.Contains(strings.Join(rest, "\n"), "data: second") {
				t.Errorf("rest of stream %q lacks the second event", rest)
			}
		})
	}
}

func TestHTTP2Upstream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, true)
	sec := githubSecret("api.test")
	p := e.startProxy(Options{Secrets: []Secret{sec}, Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("api.test")})
	for _, h2 := range []bool{false, true} {
		resp, _ := mustGet(t, p.client(e, h2), "https://api.test:"+up.port+"/h2", http.Header{"X-Key": {sec.Placeholder}})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %s", resp.Status)
		}
		if h2 && resp.ProtoMajor != 2 {
			t.Errorf("client side %s, want HTTP/2", resp.Proto)
		}
	}
	for _, r := range up.requests() {
		if r.Proto != "HTTP/2.0" {
			t.Errorf("upstream protocol %s, want HTTP/2.0", r.Proto)
		}
		if r.Header.Get("X-Key") != tokenValue {
			t.Errorf("upstream X-Key %q", r.Header.Get("X-Key"))
		}
	}
}

func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

func TestWebSocketUpgradePasses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "not a websocket upgrade", http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			wsAccept(r.Header.Get("Sec-WebSocket-Key")))
		_ = brw.Flush()
		buf := make([]byte, 5)
		for {
			if _, err := io.ReadFull(brw, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}, true, false)
	sec := githubSecret("api.test")
	p := e.startProxy(Options{Secrets: []Secret{sec}, Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("api.test")})
	tc, err := p.tlsTunnel(t, e, "api.test:"+up.port, "api.test")
	if err != nil {
		t.Fatal(err)
	}
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	fmt.Fprintf(tc, "GET /ws HTTP/1.1\r\nHost: api.test:%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n", up.port, key, sec.Placeholder)
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(key) {
		t.Fatalf("upgrade response %s %v", resp.Status, resp.Header)
	}
	for _, msg := range []string{"hello", "world"} {
		if _, err := io.WriteString(tc, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 5)
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != msg {
			t.Errorf("echo %q, want %q", got, msg)
		}
	}
	if r := up.requests(); len(r) != 1 || r[0].Header.Get("Authorization") != "Bearer "+tokenValue {
		t.Errorf("upgrade request not substituted: %+v", r)
	}
}

func TestDialTimeRefusalThroughProxy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	p := e.startProxy(Options{
		// rebind.test is allowed by name but resolves to the metadata address; loopback.test
		// resolves to a loopback address the IP allow entry does not cover.
		Policy: Policy{Allow: append([]string{"rebind.test", "loopback.test", "api.test"}, loopbackAllow...)},
		Resolver: mapResolver{
			"rebind.test":   {netip.MustParseAddr("169.254.169.254")},
			"loopback.test": {netip.MustParseAddr("127.0.0.2")},
			"api.test":      {netip.MustParseAddr("127.0.0.1")},
		},
	})
	c := p.client(e, false)
	for _, host := range []string{"rebind.test", "loopback.test"} {
		resp, body := mustGet(t, c, "https://"+host+":"+up.port+"/", nil)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "refused") {
			t.Errorf("%s: %s %q, want 403 refused", host, resp.Status, body)
		}
	}
	if resp, _ := mustGet(t, c, "https://api.test:"+up.port+"/", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("api.test: %s", resp.Status)
	}
	for _, a := range p.dialer.dialed() {
		if a != "127.0.0.1:"+up.port {
			t.Errorf("dialed %s: a refused address reached the dialer", a)
		}
	}
	if !auditHas(p.srv.Audit(0), ActionRefused, "", "rebind.test") {
		t.Errorf("refusal not audited: %+v", p.srv.Audit(0))
	}
}

func TestConnectRefusedByName(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startProxy(Options{
		Policy:   Policy{Allow: []string{"api.test"}, Deny: []string{"blocked.api.test"}},
		Resolver: loopback("api.test"),
	})
	for _, target := range []string{"evil.test:443", "169.254.169.254:80", "[fd00:ec2::254]:80", "localhost:22"} {
		_, resp := p.connect(t, target, testToken)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("CONNECT %s: %s, want 403", target, resp.Status)
		}
	}
	if d := p.dialer.dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
}

func TestSecretCIDRHostsAtDialTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	inside := Secret{Name: "INSIDE", Value: NewSecretValue("inside-value"), Placeholder: NewPlaceholder("INSIDE"), Hosts: []string{"127.0.0.0/8"}, Body: true}
	outside := Secret{Name: "OUTSIDE", Value: NewSecretValue("outside-value"), Placeholder: NewPlaceholder("OUTSIDE"), Hosts: []string{"10.0.0.0/8"}}
	p := e.startProxy(Options{
		Secrets:  []Secret{inside, outside},
		Policy:   Policy{Allow: loopbackAllow},
		Resolver: loopback("internal.test"),
	})
	c := p.client(e, false)
	u := "https://internal.test:" + up.port + "/"
	resp, _ := mustGet(t, c, u, http.Header{"X-Inside": {inside.Placeholder}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("inside: %s", resp.Status)
	}
	resp, err := c.Post(u+"body", "text/plain", strings.NewReader("v="+inside.Placeholder))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, body := mustGet(t, c, u+"outside", http.Header{"X-Outside": {outside.Placeholder}})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "OUTSIDE") {
		t.Fatalf("outside: %s %q, want 403 naming OUTSIDE", resp.Status, body)
	}
	reqs := up.requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(reqs))
	}
	if reqs[0].Header.Get("X-Inside") != "inside-value" || reqs[1].Body != "v=inside-value" {
		t.Errorf("CIDR secret not substituted: %+v", reqs)
	}
	if !auditHas(p.srv.Audit(0), ActionSubstituted, "INSIDE", "internal.test") ||
		!auditHas(p.srv.Audit(0), ActionBlocked, "OUTSIDE", "internal.test") {
		t.Errorf("audit: %+v", p.srv.Audit(0))
	}
}

// TestNoValueLeaks drives every path that handles a secret and then searches the logs, the audit
// log file, the in-memory audit events and every response the client got for the value.
func TestNoValueLeaks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "echo %s %s", r.Header.Get("Authorization"), r.URL.RawQuery)
	}, true, false)
	sec := githubSecret("api.test")
	sec.Body = true
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	p := e.startProxy(Options{
		Secrets:  []Secret{sec},
		Policy:   Policy{Allow: append([]string{"other.test", "rebind.test"}, loopbackAllow...)},
		Resolver: mapResolver{"api.test": {netip.MustParseAddr("127.0.0.1")}, "other.test": {netip.MustParseAddr("127.0.0.1")}, "rebind.test": {netip.MustParseAddr("10.1.2.3")}},
		AuditLog: auditPath,
	})
	c := p.client(e, false)
	var seen []string
	hdr := http.Header{"Authorization": {basicAuth("u", sec.Placeholder)}}
	for _, u := range []string{
		"https://api.test:" + up.port + "/ok?t=" + sec.Placeholder,
		"https://other.test:" + up.port + "/blocked?t=" + sec.Placeholder,
		"https://rebind.test:" + up.port + "/refused",
	} {
		resp, body := mustGet(t, c, u, hdr)
		seen = append(seen, body, fmt.Sprint(resp.Header))
	}
	for _, host := range []string{"api.test", "other.test"} {
		resp, err := c.Post("https://"+host+":"+up.port+"/post", "text/plain", strings.NewReader("body "+sec.Placeholder))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen = append(seen, string(b), fmt.Sprint(resp.Header))
	}
	tc, err := p.tlsTunnel(t, e, "api.test:"+up.port, "api.test")
	if err != nil {
		t.Fatal(err)
	}
	_, body := rawRequest(t, tc, "GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer "+sec.Placeholder+"\r\n\r\n")
	seen = append(seen, body)

	if up.requests()[0].Header.Get("Authorization") != basicAuth("u", tokenValue) {
		t.Fatalf("the allowed request did not carry the value; the leak test would prove nothing")
	}
	file, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	events := fmt.Sprintf("%+v", p.srv.Audit(0))
	b64 := base64.StdEncoding.EncodeToString([]byte("u:" + tokenValue))
	for name, text := range map[string]string{
		"logs": p.logs.String(), "audit file": string(file), "audit events": events,
		"client responses": strings.Join(seen, "\n"),
	} {
		if containsAnyOf(text, tokenValue, url.QueryEscape(tokenValue), b64) {
			t.Errorf("%s hold the secret value", name)
		}
	}
	if !strings.Contains(string(file), `"action":"blocked"`) || !strings.Contains(p.logs.String(), "GITHUB_TOKEN") {
		t.Errorf("audit file or logs lack the events; the leak check may be vacuous")
	}
}

// TestLargeDownloadConstantMemory streams 1 GiB through the proxy (TLS on both sides) and checks
// that the heap in use stays within 64 MiB of where it started.
func TestLargeDownloadConstantMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB download: skipped under -short")
	}
	const size = 1 << 30
	e := newEnv(t)
	up := e.startUpstream(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		chunk := make([]byte, 256<<10)
		for i := range chunk {
			chunk[i] = byte(i)
		}
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}, true, false)
	p := e.startProxy(Options{Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("dl.test")})
	p.srv.log = p.srv.log.Level(0) // keep the debug log small
	c := p.client(e, false)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse

	resp, err := c.Get("https://dl.test:" + up.port + "/big")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1<<20)
	var total, nextSample int64
	for {
		n, err := resp.Body.Read(buf)
		total += int64(n)
		if total >= nextSample {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			nextSample += 32 << 20
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after %d bytes: %v", total, err)
		}
	}
	if total != size {
		t.Fatalf("read %d bytes, want %d", total, size)
	}
	growth := int64(peak) - int64(base)
	t.Logf("1 GiB through the proxy: heap in use %d MiB at start, peak %d MiB, growth %d MiB",
		base>>20, peak>>20, growth>>20)
	if growth > 64<<20 {
		t.Errorf("heap in use grew by %d MiB, want < 64 MiB", growth>>20)
	}
}

func TestIPLiteralDestination(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	sec := githubSecret("127.0.0.1")
	p := e.startProxy(Options{Secrets: []Secret{sec}, Policy: Policy{Allow: loopbackAllow}})
	resp, _ := mustGet(t, p.client(e, false), "https://127.0.0.1:"+up.port+"/ip", http.Header{"X-Key": {sec.Placeholder}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	if got := up.requests()[0].Header.Get("X-Key"); got != tokenValue {
		t.Errorf("X-Key = %q", got)
	}
}

func TestHTTP2ClientAuthorityAndBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, true)
	sec := githubSecret("api.test")
	sec.Body = true
	p := e.startProxy(Options{Secrets: []Secret{sec}, Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("api.test", "other.test")})

	// Body substitution over an HTTP/2 client connection.
	c := p.client(e, true)
	resp, err := c.Post("https://api.test:"+up.port+"/h2body", "text/plain", strings.NewReader("k="+sec.Placeholder))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s", resp.Proto, resp.Status)
	}
	if got := up.requests()[0].Body; got != "k="+tokenValue {
		t.Errorf("upstream body %q", got)
	}

	// A stream whose :authority is not the CONNECT target gets 421 (what HTTP/2 clients expect
	// for a misdirected, coalesced request).
	tc, resp2 := p.connect(t, "api.test:"+up.port, testToken)
	if tc == nil {
		t.Fatalf("CONNECT: %s", resp2.Status)
	}
	tlsConn := tls.Client(tc, &tls.Config{ServerName: "api.test", RootCAs: e.ca.CertPool(), NextProtos: []string{"h2"}})
	if err := tlsConn.Handshake(); err != nil {
		t.Fatal(err)
	}
	if tlsConn.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("ALPN %q, want h2", tlsConn.ConnectionState().NegotiatedProtocol)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tlsConn)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	req, _ := http.NewRequest(http.MethodGet, "https://api.test:"+up.port+"/coalesced", nil)
	req.Host = "other.test:" + up.port
	req.Header.Set("Authorization", "Bearer "+sec.Placeholder)
	resp, err = cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf(":authority mismatch: %s, want 421", resp.Status)
	}
	if n := len(up.requests()); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
}

func TestCloseEndsTunnelsAndHealthz(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startUpstream(nil, true, false)
	p := e.startProxy(Options{Policy: Policy{Allow: loopbackAllow}, Resolver: loopback("api.test")})

	direct := &http.Client{Transport: &http.Transport{Proxy: nil}}
	resp, err := direct.Get("http://" + p.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %s", resp.Status)
	}

	tc, err := p.tlsTunnel(t, e, "api.test:"+up.port, "api.test")
	if err != nil {
		t.Fatal(err)
	}
	if resp, _ := rawRequest(t, tc, "GET / HTTP/1.1\r\nHost: api.test:"+up.port+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
		t.Fatalf("tunnel request: %s", resp.Status)
	}
	if err := p.srv.Close(); err != nil {
		t.Fatal(err)
	}
	// The intercepted tunnel, hijacked from net/http, is closed too: the read ends.
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Errorf("tunnel still open after Close")
	}
}
