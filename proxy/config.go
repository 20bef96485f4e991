package proxy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// Config is everything a standalone proxy needs (`agents-sandbox proxy serve --config FILE`), as
// JSON. It holds real secret values: write it with EncodeConfig (plain json.Marshal writes
// "[REDACTED]" for them) to a 0600 file or a pipe, never to anything `docker inspect` shows.
type Config struct {
	// Listen is the TCP address to listen on, e.g. ":3128" or "127.0.0.1:0".
	Listen string `json:"listen"`
	// VM names the VM served, for audit events and logs.
	VM string `json:"vm,omitempty"`
	// CACert and CAKey are the PEM files of the checkout's CA (see LoadOrCreateCA).
	CACert string `json:"ca_cert"`
	CAKey  string `json:"ca_key"`
	// Token is the per-VM proxy credential (Options.Token).
	Token string `json:"token,omitempty"`
	// Secrets with their values resolved.
	Secrets []Secret `json:"secrets,omitempty"`
	// Policy is the egress policy.
	Policy Policy `json:"policy"`
	// AuditLog is the audit log file (JSON lines); empty: in memory only.
	AuditLog string `json:"audit_log,omitempty"`
	// UpstreamCAFiles are PEM bundles trusted for upstream servers in addition to the system roots
	// (a test upstream, a corporate TLS-inspecting gateway).
	UpstreamCAFiles []string `json:"upstream_ca_files,omitempty"`
	// LogLevel is a zerolog level name ("debug", "info", …); empty: info.
	LogLevel string `json:"log_level,omitempty"`
}

// wireSecret is Secret with its value in the clear, for EncodeConfig.
type wireSecret struct {
	Name         string   `json:"name"`
	Value        string   `json:"value"`
	Placeholder  string   `json:"placeholder"`
	Hosts        []string `json:"hosts,omitempty"`
	Body         bool     `json:"body,omitempty"`
	AllowAnyHost bool     `json:"allow_any_host_dangerous,omitempty"`
}

type plainConfig Config

type wireConfig struct {
	plainConfig
	Secrets []wireSecret `json:"secrets,omitempty"`
}

// EncodeConfig writes cfg as indented JSON with the real secret values, for the proxy process to
// read with DecodeConfig.
func EncodeConfig(w io.Writer, cfg Config) error {
	wc := wireConfig{plainConfig: plainConfig(cfg)}
	for _, s := range cfg.Secrets {
		wc.Secrets = append(wc.Secrets, wireSecret{
			Name: s.Name, Value: s.Value.Reveal(), Placeholder: s.Placeholder,
			Hosts: s.Hosts, Body: s.Body, AllowAnyHost: s.AllowAnyHost,
		})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(wc); err != nil {
		return fmt.Errorf("encode proxy config: %w", err)
	}
	return nil
}

// DecodeConfig reads a Config written by EncodeConfig. Unknown fields are an error.
func DecodeConfig(r io.Reader) (Config, error) {
	var cfg Config
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("decode proxy config: %w", err)
	}
	return cfg, nil
}

// ReadConfigFile reads a Config from path ("-": standard input).
func ReadConfigFile(path string) (Config, error) {
	if path == "-" {
		return DecodeConfig(os.Stdin)
	}
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("read proxy config: %w", err)
	}
	defer f.Close()
	cfg, err := DecodeConfig(f)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Run serves the proxy described by cfg until ctx is cancelled, then shuts it down (waiting up to
// 5 s for requests in flight) and returns nil. It logs JSON lines to stderr through a
// RedactingWriter that masks every secret value. It fails when the config is invalid or the
// address cannot be listened on.
func Run(ctx context.Context, cfg Config) error {
	return run(ctx, cfg, os.Stderr, nil)
}

func run(ctx context.Context, cfg Config, logOut io.Writer, ready func(net.Addr)) error {
	values := make([]string, 0, len(cfg.Secrets))
	for _, s := range cfg.Secrets {
		values = append(values, s.Value.Reveal())
	}
	rw := RedactingWriter(logOut, values...)
	defer func() { _ = rw.Flush() }()
	level := zerolog.InfoLevel
	if cfg.LogLevel != "" {
		l, err := zerolog.ParseLevel(cfg.LogLevel)
		if err != nil {
			return fmt.Errorf("run proxy: log level: %w", err)
		}
		level = l
	}
	logger := zerolog.New(rw).Level(level).With().Timestamp().Str("vm", cfg.VM).Logger()

	ca, err := LoadCA(cfg.CACert, cfg.CAKey)
	if err != nil {
		return fmt.Errorf("run proxy: %w", err)
	}
	var roots *x509.CertPool
	if len(cfg.UpstreamCAFiles) > 0 {
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		for _, f := range cfg.UpstreamCAFiles {
			pemBytes, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("run proxy: upstream CA: %w", err)
			}
			if !roots.AppendCertsFromPEM(pemBytes) {
				return fmt.Errorf("run proxy: upstream CA %s: no PEM certificate found", f)
			}
		}
	}
	srv, err := New(Options{
		VM: cfg.VM, CA: ca, Secrets: cfg.Secrets, Policy: cfg.Policy, Token: cfg.Token,
		AuditLog: cfg.AuditLog, Logger: logger, UpstreamRootCAs: roots,
	})
	if err != nil {
		return fmt.Errorf("run proxy: %w", err)
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("run proxy: %w", err)
	}
	logger.Info().Str("addr", l.Addr().String()).Int("secrets", len(cfg.Secrets)).
		Str("mode", string(srv.rules.Mode())).Msg("proxy listening")
	if ready != nil {
		ready(l.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		_ = srv.Close()
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = nil // requests still in flight are cut off by Close; that is what stopping means
	}
	err = errors.Join(err, srv.Close(), <-errc)
	logger.Info().Msg("proxy stopped")
	if err != nil {
		return fmt.Errorf("run proxy: stop: %w", err)
	}
	return nil
}
