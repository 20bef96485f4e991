package proxy

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"
)

// Options configure a Server.
type Options struct {
	// VM names the VM this proxy serves; it is recorded in audit events and logs.
	VM string
	// CA signs the certificates presented to the VM. Required.
	CA *CA
	// Secrets are substituted as described in the package doc.
	Secrets []Secret
	// Policy is the egress policy.
	Policy Policy
	// Token is the per-VM proxy credential: when set, every proxy request and CONNECT needs
	// "Proxy-Authorization: Basic base64(<any user>:<Token>)" (clients send it when HTTP_PROXY is
	// http://vm:token@host:port), else it gets 407. Empty disables the check, which is only safe when
	// nothing but the VM can reach the proxy.
	Token string
	// AuditLog is a file that audit events are appended to as JSON lines (created 0600).
	// Empty: audit events are kept in memory only.
	AuditLog string
	// AuditRing is how many recent events Audit can return; 0 means DefaultAuditRing.
	AuditRing int
	// Logger receives the proxy's logs. It never gets a secret value. Zero value: no logs.
	Logger zerolog.Logger
	// Resolver resolves upstream host names right before dialing; nil: net.DefaultResolver.
	Resolver Resolver
	// Dialer opens upstream TCP connections to addresses the policy has allowed; nil: a
	// net.Dialer with a 30 s timeout.
	Dialer ContextDialer
	// UpstreamRootCAs verifies upstream servers; nil: the system roots.
	UpstreamRootCAs *x509.CertPool
}

// Server is the proxy. It is an http.Handler for proxy requests (absolute URLs and CONNECT);
// Serve runs it on a listener. Create it with New.
type Server struct {
	vm        string
	log       zerolog.Logger
	ca        *CA
	rules     *Rules
	secrets   []*secretRule
	hasBody   bool
	token     string
	audit     *auditLog
	redactor  *strings.Replacer
	gp        *goproxy.ProxyHttpServer
	dialer    *PolicyDialer
	transport *http.Transport
	http      *http.Server

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// New checks opts (secrets, policy, CA) and builds a Server. It opens the audit log file if one is
// configured; Close closes it. Errors name the invalid secret or pattern, never a value.
func New(opts Options) (*Server, error) {
	if opts.CA == nil {
		return nil, errors.New("new proxy: no CA")
	}
	secrets, err := compileSecrets(opts.Secrets)
	if err != nil {
		return nil, fmt.Errorf("new proxy: %w", err)
	}
	rules, err := CompilePolicy(opts.Policy, opts.Secrets)
	if err != nil {
		return nil, fmt.Errorf("new proxy: %w", err)
	}
	audit, err := openAuditLog(opts.AuditLog, opts.AuditRing)
	if err != nil {
		return nil, fmt.Errorf("new proxy: %w", err)
	}
	s := &Server{
		vm:      opts.VM,
		log:     opts.Logger,
		ca:      opts.CA,
		rules:   rules,
		secrets: secrets,
		token:   opts.Token,
		audit:   audit,
		conns:   map[*trackedConn]struct{}{},
	}
	var pairs []string
	for _, sec := range secrets {
		s.hasBody = s.hasBody || sec.body
		pairs = append(pairs, sec.value, Redacted)
		if sec.anyHost {
			s.log.Warn().Str("secret", sec.name).Msg("secret may be sent to any host the policy allows (allow_any_host_dangerous)")
		}
	}
	s.redactor = strings.NewReplacer(pairs...)
	if s.token == "" {
		s.log.Warn().Msg("proxy credential disabled: anything that reaches the proxy can use it")
	}

	dialer := opts.Dialer
	if dialer == nil {
		dialer = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	}
	s.dialer = &PolicyDialer{Rules: rules, Resolver: opts.Resolver, Dialer: dialer}
	s.transport = &http.Transport{
		Proxy:                 nil,
		DialContext:           s.dialer.DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: opts.UpstreamRootCAs, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass bodies through as the upstream encoded them
	}

	gp := goproxy.NewProxyHttpServer()
	gp.Tr = s.transport
	gp.ConnectDial = nil // NewProxyHttpServer honours HTTPS_PROXY; we never chain
	gp.ConnectDialWithReq = nil
	gp.Logger = goproxyLogger{s}
	gp.Verbose = false
	gp.KeepAcceptEncoding = true
	gp.AllowHTTP2 = true
	gp.NonproxyHandler = http.HandlerFunc(s.serveLocal)
	gp.OnRequest().HandleConnectFunc(s.handleConnect)
	gp.OnRequest().DoFunc(s.handleRequest)
	s.gp = gp

	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(logWriter{s}, "", 0),
	}
	return s, nil
}

// Audit returns up to n recent audit events, oldest first (n <= 0: all kept, at most
// Options.AuditRing).
func (s *Server) Audit(n int) []AuditEvent { return s.audit.last(n) }

// Serve accepts proxy connections on l until Shutdown or Close; it then returns nil. Any other
// failure is returned wrapped.
func (s *Server) Serve(l net.Listener) error {
	err := s.http.Serve(trackingListener{Listener: l, s: s})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve proxy on %s: %w", l.Addr(), err)
}

// Shutdown stops accepting connections, waits (until ctx ends) for plain requests in flight,
// then closes the intercepted tunnels and the audit log.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	return errors.Join(err, s.closeAll())
}

// Close closes the listeners, every client connection (tunnels included) and the audit log.
func (s *Server) Close() error {
	err := s.http.Close()
	return errors.Join(err, s.closeAll())
}

func (s *Server) closeAll() error {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = map[*trackedConn]struct{}{}
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	s.transport.CloseIdleConnections()
	return s.audit.close()
}

// ServeHTTP serves one request to the proxy: a CONNECT, an absolute-URL proxy request, or (for a
// relative URL) /healthz.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect && !r.URL.IsAbs() {
		s.serveLocal(w, r)
		return
	}
	if !s.authorized(r) {
		host := r.URL.Hostname()
		s.record(AuditEvent{Host: normalizeHost(host), Method: r.Method, Path: r.URL.Path, Action: ActionRefused,
			Reason: "missing or wrong proxy credential"})
		w.Header().Set("Proxy-Authenticate", `Basic realm="agents-sandbox proxy"`)
		http.Error(w, "agents-sandbox proxy: proxy authentication required: "+
			"use the proxy URL with its credential (HTTP_PROXY=http://<vm>:<token>@<host>:<port>)",
			http.StatusProxyAuthRequired)
		return
	}
	if r.Method == http.MethodConnect {
		host, _, err := splitHostPortDefault(r.URL.Host, "")
		if err != nil || !strings.Contains(r.URL.Host, ":") {
			http.Error(w, fmt.Sprintf("agents-sandbox proxy: refused: invalid CONNECT target %q: want host:port", r.URL.Host),
				http.StatusBadRequest)
			return
		}
		if err := s.rules.CheckName(host); err != nil {
			s.record(AuditEvent{Host: host, Method: r.Method, Action: ActionRefused, Reason: err.Error()})
			http.Error(w, "agents-sandbox proxy: refused: "+err.Error(), http.StatusForbidden)
			return
		}
	}
	s.gp.ServeHTTP(w, r)
}

// serveLocal answers requests addressed to the proxy itself.
func (s *Server) serveLocal(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	http.Error(w, "agents-sandbox proxy: this is a forward proxy; send absolute-URL or CONNECT requests", http.StatusBadRequest)
}

// authorized checks the proxy credential in constant time; any user name is accepted.
func (s *Server) authorized(r *http.Request) bool {
	if s.token == "" {
		return true
	}
	_, cred, ok := decodeBasic(r.Header.Get("Proxy-Authorization"))
	if !ok {
		return false
	}
	_, pass, ok := strings.Cut(cred, ":")
	return ok && subtle.ConstantTimeCompare([]byte(pass), []byte(s.token)) == 1
}

// record stores an audit event and logs it.
func (s *Server) record(e AuditEvent) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	e.VM = s.vm
	e.Reason = s.redact(e.Reason)
	if err := s.audit.add(e); err != nil {
		s.log.Error().Err(errors.New(s.redact(err.Error()))).Msg("audit log")
	}
	lvl := zerolog.WarnLevel
	if e.Action == ActionSubstituted {
		lvl = zerolog.InfoLevel
	}
	s.log.WithLevel(lvl).Str("action", string(e.Action)).Str("secret", e.Secret).Str("host", e.Host).
		Str("method", e.Method).Str("path", e.Path).Str("reason", e.Reason).Msg("audit")
}

// redact masks every secret value in s.
func (s *Server) redact(v string) string { return s.redactor.Replace(v) }

// errorResponse builds the proxy's own answer to a request it does not forward. msg must not hold
// a value; it is redacted anyway.
func (s *Server) errorResponse(req *http.Request, code int, kind, msg string) *http.Response {
	body := "agents-sandbox proxy: " + kind + ": " + s.redact(msg) + "\n"
	return &http.Response{
		StatusCode: code,
		Status:     fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":           {"text/plain; charset=utf-8"},
			"X-Agents-Sandbox-Proxy": {kind},
		},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
		Close:         true, // an unread request body must not be parsed as the next request
	}
}

// goproxyLogger routes goproxy's messages to the logger at debug level, redacted.
type goproxyLogger struct{ s *Server }

func (l goproxyLogger) Printf(format string, v ...any) {
	l.s.log.Debug().Str("component", "goproxy").Msg(l.s.redact(strings.TrimSpace(fmt.Sprintf(format, v...))))
}

// logWriter routes net/http's error log to the logger, redacted.
type logWriter struct{ s *Server }

func (l logWriter) Write(p []byte) (int, error) {
	l.s.log.Debug().Str("component", "http").Msg(l.s.redact(strings.TrimSpace(string(p))))
	return len(p), nil
}

// trackingListener remembers accepted connections so Close can end hijacked tunnels too.
type trackingListener struct {
	net.Listener
	s *Server
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, s: l.s}
	l.s.mu.Lock()
	closed := l.s.closed
	if !closed {
		l.s.conns[tc] = struct{}{}
	}
	l.s.mu.Unlock()
	if closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when the underlying one supports it.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
