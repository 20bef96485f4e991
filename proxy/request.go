package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/elazarl/goproxy"
)

// tunnel is one intercepted CONNECT: its target, and whether the TLS handshake (with a matching
// SNI) happened.
type tunnel struct {
	host string     // normalized CONNECT host
	port string     // CONNECT port
	ip   netip.Addr // valid when host is an IP literal

	mu     sync.Mutex
	tlsSNI bool // the handshake completed the SNI check
}

func (t *tunnel) sniVerified() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tlsSNI
}

// destination is a verified request destination.
type destination struct {
	host string     // normalized host name or IP literal
	port string     // port, defaulted by scheme
	ip   netip.Addr // valid when host is an IP literal
}

// handleConnect intercepts every CONNECT the policy let through (ServeHTTP checked it).
func (s *Server) handleConnect(target string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	host, port, err := splitHostPortDefault(target, "")
	if err != nil {
		return &goproxy.ConnectAction{Action: goproxy.ConnectReject}, target
	}
	tun := &tunnel{host: host, port: port}
	if ip, ok := parseIPLiteral(host); ok {
		tun.ip = ip
	}
	ctx.UserData = tun
	return &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: s.tlsConfig(tun)}, target
}

// tlsConfig returns the server-side TLS configuration of one tunnel: the handshake fails unless the
// client's SNI names the CONNECT target (or, for an IP target, is absent).
func (s *Server) tlsConfig(tun *tunnel) func(string, *goproxy.ProxyCtx) (*tls.Config, error) {
	return func(string, *goproxy.ProxyCtx) (*tls.Config, error) {
		return &tls.Config{
			MinVersion: tls.VersionTLS12,
			GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
				sni := normalizeHost(hello.ServerName)
				if sni != tun.host && !(sni == "" && tun.ip.IsValid()) {
					reason := fmt.Sprintf("TLS SNI %q does not match the CONNECT target %s", truncate(hello.ServerName, 256), tun.host)
					s.record(AuditEvent{Host: tun.host, Method: http.MethodConnect, Action: ActionRefused, Reason: reason})
					return nil, errors.New(reason)
				}
				tun.mu.Lock()
				tun.tlsSNI = true
				tun.mu.Unlock()
				return s.ca.LeafCertificate(tun.host)
			},
		}, nil
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// verifyDestination checks that the request's URL host, its Host header and (inside a tunnel)
// the CONNECT target and SNI agree, and returns the destination.
func verifyDestination(req *http.Request, tun *tunnel) (destination, error) {
	defPort := map[string]string{"https": "443", "http": "80"}[req.URL.Scheme]
	if defPort == "" {
		return destination{}, fmt.Errorf("unsupported URL scheme %q", req.URL.Scheme)
	}
	uh, up, err := splitHostPortDefault(req.URL.Host, defPort)
	if err != nil {
		return destination{}, fmt.Errorf("request URL: %w", err)
	}
	if req.Host != "" {
		hh, hp, err := splitHostPortDefault(req.Host, defPort)
		if err != nil {
			return destination{}, fmt.Errorf("the Host header: %w", err)
		}
		if hh != uh || hp != up {
			return destination{}, fmt.Errorf("the Host header %q does not match the request URL host %q", truncate(req.Host, 256), truncate(req.URL.Host, 256))
		}
	}
	if tun != nil {
		if uh != tun.host || up != tun.port {
			return destination{}, fmt.Errorf("request for %s inside a tunnel to %s", net.JoinHostPort(uh, up), net.JoinHostPort(tun.host, tun.port))
		}
		if req.URL.Scheme == "https" && !tun.sniVerified() {
			return destination{}, errors.New("TLS SNI not verified")
		}
	}
	d := destination{host: uh, port: up}
	if ip, ok := parseIPLiteral(uh); ok {
		d.ip = ip
	}
	return d, nil
}

// reqState follows one forwarded request from the request handler to the response.
type reqState struct {
	s      *Server
	dest   destination
	method string
	path   string

	// hard are secrets substituted in headers or URL whose hosts match only by CIDR: the dial must
	// reach an address inside them.
	hard secretSet
	// sent are the secrets whose value the request may carry, masked in the response.
	sent secretSet
	// encoded are other forms of values the request carries (escaped, inside a Basic token), with
	// what the VM sent instead, also masked in the response.
	encoded [][2]string
	// transport is a one-request transport used when hard or body secrets depend on the dialed
	// address; nil: the shared transport.
	transport *http.Transport

	mu          sync.Mutex
	dialedIP    netip.Addr
	bodyAudited map[*secretRule]bool
}

func (st *reqState) event(a Action, secret, reason string) AuditEvent {
	return AuditEvent{Secret: secret, Host: st.dest.host, Method: st.method, Path: st.path, Action: a, Reason: reason}
}

// blockedError is a secret headed for a host it may not go to.
type blockedError struct {
	secret  string
	host    string
	hosts   string
	audited bool
}

func (e *blockedError) Error() string {
	return fmt.Sprintf("the placeholder of secret %s may not be sent to %s (its hosts: %s)", e.secret, e.host, e.hosts)
}

// handleRequest is goproxy's request filter, for plain proxy requests and for every request inside
// an intercepted tunnel: it verifies the destination, checks the policy, blocks or substitutes
// placeholders, and routes the request through s.roundTrip.
func (s *Server) handleRequest(req *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	tun, _ := ctx.UserData.(*tunnel)
	st := &reqState{s: s, method: req.Method, path: req.URL.Path}
	dest, err := verifyDestination(req, tun)
	if err != nil {
		st.dest.host = normalizeHost(req.URL.Hostname())
		if tun != nil {
			st.dest.host = tun.host
		}
		s.record(st.event(ActionRefused, "", err.Error()))
		return req, s.errorResponse(req, http.StatusMisdirectedRequest, "refused", err.Error())
	}
	st.dest = dest
	if err := s.rules.CheckName(dest.host); err != nil {
		s.record(st.event(ActionRefused, "", err.Error()))
		return req, s.errorResponse(req, http.StatusForbidden, "refused", err.Error())
	}

	found := requestPlaceholders(s.secrets, req)
	for _, sec := range found {
		if sec.verdict(dest) == verdictDeny {
			be := &blockedError{secret: sec.name, host: dest.host, hosts: sec.hosts.String()}
			s.record(st.event(ActionBlocked, sec.name, be.Error()))
			return req, s.errorResponse(req, http.StatusForbidden, "blocked", be.Error())
		}
	}
	var now secretSet
	for _, sec := range found {
		if sec.verdict(dest) == verdictIfIP {
			st.hard.add(sec)
		} else {
			now.add(sec)
		}
		st.sent.add(sec)
	}
	st.encoded = substituteRequest(req, found)

	soft := s.wrapBody(req, st)
	if len(st.hard) > 0 || soft {
		st.transport = s.pinnedTransport(st)
	}
	for _, sec := range now {
		s.record(st.event(ActionSubstituted, sec.name, ""))
	}
	s.log.Debug().Str("method", req.Method).Str("host", dest.host).Str("path", st.path).Msg("forward")
	ctx.RoundTripper = goproxy.RoundTripperFunc(func(r *http.Request, _ *goproxy.ProxyCtx) (*http.Response, error) {
		return s.roundTrip(st, r)
	})
	return req, nil
}

// wrapBody streams the request body through the substitution of secrets with Body set, when at
// least one of them may go to this destination; other bodies pass untouched (a placeholder in
// them reaches the host as the harmless placeholder it is). In a wrapped body, the placeholder of
// a Body secret that may not go here stops the upload. It reports whether a body secret depends on
// the dialed address (verdictIfIP).
func (s *Server) wrapBody(req *http.Request, st *reqState) bool {
	if !s.hasBody || req.Body == nil || req.Body == http.NoBody {
		return false
	}
	var secs []*secretRule
	var pats [][]byte
	soft, usable := false, false
	for _, sec := range s.secrets {
		if !sec.body {
			continue
		}
		v := sec.verdict(st.dest)
		soft = soft || v == verdictIfIP
		usable = usable || v != verdictDeny
		secs = append(secs, sec)
		pats = append(pats, []byte(sec.ph))
	}
	if !usable {
		return false
	}
	for _, sec := range secs {
		if sec.verdict(st.dest) != verdictDeny {
			st.sent.add(sec)
		}
	}
	st.bodyAudited = map[*secretRule]bool{}
	repl := func(i int) ([]byte, error) {
		sec := secs[i]
		ok := false
		switch sec.verdict(st.dest) {
		case verdictAllow:
			ok = true
		case verdictIfIP:
			st.mu.Lock()
			ip := st.dialedIP
			st.mu.Unlock()
			ok = ip.IsValid() && sec.hosts.MatchIP(ip)
		}
		if !ok {
			be := &blockedError{secret: sec.name, host: st.dest.host, hosts: sec.hosts.String(), audited: true}
			s.record(st.event(ActionBlocked, sec.name, be.Error()+" (in the request body)"))
			return nil, be
		}
		st.mu.Lock()
		first := !st.bodyAudited[sec]
		st.bodyAudited[sec] = true
		st.mu.Unlock()
		if first {
			s.record(st.event(ActionSubstituted, sec.name, "in the request body"))
		}
		return []byte(sec.value), nil
	}
	body := req.Body
	req.Body = &readCloser{Reader: newReplacingReader(body, newMatcher(pats), repl), Closer: body}
	req.ContentLength = -1 // the length changes; the upload becomes chunked
	req.Header.Del("Content-Length")
	return soft
}

type readCloser struct {
	io.Reader
	io.Closer
}

// pinnedTransport returns a one-request transport whose dialer also checks that the address
// reached lies inside the CIDRs of the hard secrets, and records it for the body secrets.
func (s *Server) pinnedTransport(st *reqState) *http.Transport {
	t := s.transport.Clone()
	t.DisableKeepAlives = true
	d := &PolicyDialer{
		Rules:    s.rules,
		Resolver: s.dialer.Resolver,
		Dialer:   s.dialer.Dialer,
		Check: func(host string, ip netip.Addr) error {
			for _, sec := range st.hard {
				if !sec.hosts.MatchIP(ip) {
					return &blockedError{secret: sec.name, host: fmt.Sprintf("%s (%s)", host, ip), hosts: sec.hosts.String()}
				}
			}
			return nil
		},
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if ap, perr := netip.ParseAddrPort(c.RemoteAddr().String()); perr == nil {
			st.mu.Lock()
			st.dialedIP = ap.Addr().Unmap()
			st.mu.Unlock()
		}
		return c, nil
	}
	return t
}

// roundTrip sends the request upstream and turns refusals and failures into responses.
func (s *Server) roundTrip(st *reqState, req *http.Request) (*http.Response, error) {
	tr := s.transport
	if st.transport != nil {
		tr = st.transport
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		if st.transport != nil {
			st.transport.CloseIdleConnections()
		}
		var be *blockedError
		if errors.As(err, &be) {
			if !be.audited {
				s.record(st.event(ActionBlocked, be.secret, be.Error()))
			}
			return s.errorResponse(req, http.StatusForbidden, "blocked", be.Error()), nil
		}
		var pe *PolicyError
		if errors.As(err, &pe) {
			s.record(st.event(ActionRefused, "", pe.Error()))
			return s.errorResponse(req, http.StatusForbidden, "refused", pe.Error()), nil
		}
		s.auditHard(st)
		msg := s.redact(err.Error())
		s.log.Warn().Str("host", st.dest.host).Str("method", st.method).Str("path", st.path).Str("error", msg).Msg("upstream request failed")
		return s.errorResponse(req, http.StatusBadGateway, "upstream error", msg), nil
	}
	s.auditHard(st)
	s.log.Info().Str("method", st.method).Str("host", st.dest.host).Str("path", st.path).Int("status", resp.StatusCode).Msg("request")
	if len(st.sent) > 0 {
		s.maskResponse(req, resp, st)
	}
	if st.transport != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		t, body := st.transport, resp.Body
		resp.Body = &readCloser{Reader: body, Closer: closerFunc(func() error {
			err := body.Close()
			t.CloseIdleConnections()
			return err
		})}
	}
	return resp, nil
}

// auditHard records the substitution of secrets that depended on the dialed address, once the
// request went out.
func (s *Server) auditHard(st *reqState) {
	for _, sec := range st.hard {
		s.record(st.event(ActionSubstituted, sec.name, "destination address inside the secret's hosts"))
	}
}

// maskResponse replaces the values of secrets the request may have carried (and the encoded
// forms the proxy produced) by what the VM sent, in the response headers and body, so an upstream
// that echoes a value does not hand it to the VM.
func (s *Server) maskResponse(req *http.Request, resp *http.Response, st *reqState) {
	pairs := make([][2]string, 0, len(st.sent)+len(st.encoded))
	for _, sec := range st.sent {
		pairs = append(pairs, [2]string{sec.value, sec.ph})
	}
	pairs = append(pairs, st.encoded...)
	maskHeader(resp.Header, pairs)
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified || req.Method == http.MethodHead ||
		resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	pats := make([][]byte, len(pairs))
	for i, p := range pairs {
		pats[i] = []byte(p[0])
	}
	body := resp.Body
	resp.Body = &readCloser{
		Reader: newReplacingReader(body, newMatcher(pats), func(i int) ([]byte, error) { return []byte(pairs[i][1]), nil }),
		Closer: body,
	}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
