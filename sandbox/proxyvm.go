package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agents-sandbox/agents-sandbox/proxy"
)

// The secret proxy runs in a container beside the VM, from an image holding
// only the agents-sandbox binary and the host's CA bundle. In proxy mode the
// VM sits on an internal network whose only other member is the proxy and on
// which the host has no address (so the VM reaches no host service either);
// the proxy also sits on the shared egress network, its only way out.
const (
	// EgressNetwork is the shared network proxies reach the outside from.
	EgressNetwork = "agents-sandbox-egress"
	// ProxyAlias is the proxy's DNS name on a VM's internal network.
	ProxyAlias = "proxy"
	// ProxyPort is the port the proxy listens on.
	ProxyPort = 3128
	// proxyBin is where the binary sits in the proxy image.
	proxyBin = "/agents-sandbox"
	// proxyAuditLog is the audit log inside the proxy container.
	proxyAuditLog = "/audit/audit.jsonl"
	// VMCAPath is where the proxy's CA certificate is put inside the VM.
	VMCAPath = "/usr/local/share/ca-certificates/agents-sandbox-proxy.crt"
	// vmCABundle is the system bundle update-ca-certificates writes.
	vmCABundle      = "/etc/ssl/certs/ca-certificates.crt"
	labelProxyImage = "org.agents-sandbox.proxy-image"
)

// proxyNames are the names of a VM's proxy artifacts.
func proxyNames(p *Project) (container, network string) {
	return p.Names.VM + "-proxy", p.Names.VM + "-net"
}

// ensureProxy prepares proxy-mode egress: the VM's internal network, the
// placeholders and the environment. The proxy container itself is started
// by startProxy.
func (m *Manager) ensureProxy(ctx context.Context, p *Project, as *AgentState) (egress, error) {
	nw, ok := m.RT.(Networker)
	if !ok {
		return egress{}, fmt.Errorf("network.mode \"proxy\": %w: the %T runtime cannot manage networks; use network.mode = \"open\" or \"none\"", ErrInvalid, m.RT)
	}
	if err := m.ensureVMNetwork(ctx, p, nw); err != nil {
		return egress{}, err
	}
	_, netName := proxyNames(p)
	if as.Placeholders == nil {
		as.Placeholders = map[string]string{}
	}
	if as.ProxyToken == "" {
		as.ProxyToken = randomHex(16)
	}
	secretEnv := map[string]string{}
	for _, name := range sortedKeys(p.Config.Secrets) {
		if p.Config.Secrets[name].AllowAnyHostDangerous {
			// On every run, not only when the proxy starts.
			m.Log.Warn().Str("secret", name).Msg("allow_any_host_dangerous: this secret may be sent to any host the egress policy allows")
		}
		ph := as.Placeholders[name]
		if ph == "" {
			ph = proxy.NewPlaceholder(name)
			as.Placeholders[name] = ph
		}
		secretEnv[name] = ph
	}
	for name := range as.Placeholders {
		if _, ok := p.Config.Secrets[name]; !ok {
			delete(as.Placeholders, name)
		}
	}
	url := fmt.Sprintf("http://vm:%s@%s:%d", as.ProxyToken, ProxyAlias, ProxyPort)
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		secretEnv[k] = url
	}
	env := map[string]string{
		"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
		"NODE_EXTRA_CA_CERTS": VMCAPath,
		"SSL_CERT_FILE":       vmCABundle,
		"REQUESTS_CA_BUNDLE":  vmCABundle,
		"GIT_SSL_CAINFO":      vmCABundle,
		"CURL_CA_BUNDLE":      vmCABundle,
	}
	return egress{Network: netName, Env: env, SecretEnv: secretEnv, Proxy: true}, nil
}

// ensureVMNetwork makes sure the VM's own network exists as its mode needs
// it: in proxy mode internal (no route out) and without a host address (the
// VM must not reach the host's services either), in open mode an ordinary
// bridge. A network made for the other mode, or by a version that left the
// host reachable, is replaced: the VM and the proxy on it are removed first
// (Create makes them again; the home volume stays).
func (m *Manager) ensureVMNetwork(ctx context.Context, p *Project, nw Networker) error {
	proxyName, netName := proxyNames(p)
	isolated := p.Config.Network.Mode == NetworkProxy
	spec := NetworkSpec{Name: netName, Labels: p.ID.Labels(p.Names.Agent, KindNet), Internal: isolated, NoHostAccess: isolated}
	cur, err := nw.InspectNetwork(ctx, netName)
	switch {
	case isNotFound(err):
	case err != nil:
		return fmt.Errorf("inspect network %q: %w", netName, err)
	case cur.Internal == spec.Internal && cur.NoHostAccess == spec.NoHostAccess:
		return nil
	default:
		m.Log.Info().Str("network", netName).Str("mode", string(p.Config.Network.Mode)).
			Msg("the VM's network does not match the network mode: replacing it, with the VM and its proxy (the home volume is kept)")
		for _, c := range []string{p.Names.VM, proxyName} {
			if err := m.RT.RemoveVM(ctx, c, true); err != nil && !isNotFound(err) {
				return fmt.Errorf("replace network %q: remove %q: %w", netName, c, err)
			}
		}
		if err := nw.RemoveNetwork(ctx, netName); err != nil && !isNotFound(err) {
			if errors.Is(err, ErrConflict) {
				return fmt.Errorf("replace network %q for network.mode %q: %w; remove this checkout's task sandboxes (agents-sandbox prune) and retry", netName, p.Config.Network.Mode, err)
			}
			return fmt.Errorf("replace network %q: %w", netName, err)
		}
	}
	if _, err := nw.CreateNetwork(ctx, spec); err != nil && !errors.Is(err, ErrConflict) {
		return fmt.Errorf("create network %q: %w", netName, err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// proxyRunning reports whether the project's proxy container runs.
func (m *Manager) proxyRunning(ctx context.Context, p *Project) bool {
	name, _ := proxyNames(p)
	vm, err := m.RT.InspectVM(ctx, name)
	return err == nil && vm.State == VMRunning
}

// startProxy (re)creates and starts the proxy container with freshly read
// secret values. The values travel in a file copied into the container
// before it starts: never in its environment, labels or command line.
func (m *Manager) startProxy(ctx context.Context, p *Project, as *AgentState) error {
	name, netName := proxyNames(p)
	nw := m.RT.(Networker)
	if _, err := nw.InspectNetwork(ctx, EgressNetwork); isNotFound(err) {
		if _, err := nw.CreateNetwork(ctx, NetworkSpec{Name: EgressNetwork, Labels: map[string]string{LabelKind: string(KindNet)}}); err != nil && !errors.Is(err, ErrConflict) {
			return fmt.Errorf("create network %q: %w", EgressNetwork, err)
		}
	} else if err != nil {
		return err
	}
	image, err := m.ensureProxyImage(ctx)
	if err != nil {
		return err
	}
	ca, err := proxy.LoadOrCreateCA(filepath.Join(p.Names.StateDir, "ca"))
	if err != nil {
		return fmt.Errorf("proxy CA: %w", err)
	}

	cfg := proxy.Config{
		Listen:   fmt.Sprintf(":%d", ProxyPort),
		VM:       p.Names.VM,
		CACert:   "/config/ca.pem",
		CAKey:    "/config/ca-key.pem",
		Token:    as.ProxyToken,
		AuditLog: proxyAuditLog,
		Policy:   proxy.Policy{Mode: proxy.Mode(p.Config.Network.Mode), Allow: p.Config.Network.Allow, Deny: p.Config.Network.Deny},
		LogLevel: "info",
	}
	names := make([]string, 0, len(p.Config.Secrets))
	for n := range p.Config.Secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	baseDir := p.ID.ProjectDir
	for _, n := range names {
		s := p.Config.Secrets[n]
		val, err := proxy.ResolveSecretValueEnv(ctx, s.From, baseDir, m.environ())
		if err != nil {
			return fmt.Errorf("secret %s: %w: %w", n, ErrInvalid, err)
		}
		cfg.Secrets = append(cfg.Secrets, proxy.Secret{Name: n, Value: proxy.NewSecretValue(val), Placeholder: as.Placeholders[n], Hosts: s.Hosts, Body: s.Body, AllowAnyHost: s.AllowAnyHostDangerous})
	}
	files := map[string][]byte{"config/ca.pem": ca.CertPEM()}
	keyPEM, err := os.ReadFile(filepath.Join(p.Names.StateDir, "ca", "ca-key.pem"))
	if err != nil {
		return fmt.Errorf("proxy CA key: %w", err)
	}
	files["config/ca-key.pem"] = keyPEM
	for i, f := range p.Config.Image.CACertificates {
		data, err := os.ReadFile(expandHome(f, m.Environ))
		if err != nil {
			return fmt.Errorf("image.ca_certificates %q: %w: %v", f, ErrInvalid, err)
		}
		n := fmt.Sprintf("config/upstream-ca-%d.pem", i)
		files[n] = data
		cfg.UpstreamCAFiles = append(cfg.UpstreamCAFiles, "/"+n)
	}
	var cbuf bytes.Buffer
	if err := proxy.EncodeConfig(&cbuf, cfg); err != nil {
		return err
	}
	files["config/proxy.json"] = cbuf.Bytes()

	if err := m.RT.RemoveVM(ctx, name, true); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove old proxy %q: %w", name, err)
	}
	labels := p.ID.Labels(p.Names.Agent, KindProxy)
	spec := VMSpec{
		Name:        name,
		Image:       image,
		Labels:      labels,
		Entrypoint:  []string{proxyBin, "proxy", "serve", "--config", "/config/proxy.json"},
		Cmd:         []string{},
		User:        "65534:65534",
		Network:     EgressNetwork,
		CapDrop:     []string{"ALL"},
		NoNewPrivs:  true,
		MemoryBytes: 512 << 20,
		PidsLimit:   256,
		StopTimeout: 5 * time.Second,
	}
	if _, err := m.RT.CreateVM(ctx, spec); err != nil {
		return fmt.Errorf("create proxy %q: %w", name, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = m.RT.RemoveVM(context.WithoutCancel(ctx), name, true)
		}
	}()
	var tbuf bytes.Buffer
	tw := tar.NewWriter(&tbuf)
	for _, d := range []string{"config/", "audit/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o700, Uid: 65534, Gid: 65534, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
	}
	fnames := make([]string, 0, len(files))
	for n := range files {
		fnames = append(fnames, n)
	}
	sort.Strings(fnames)
	for _, n := range fnames {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o400, Size: int64(len(files[n])), Uid: 65534, Gid: 65534, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := m.RT.CopyTo(ctx, name, "/", &tbuf); err != nil {
		return fmt.Errorf("copy proxy config into %q: %w", name, err)
	}
	if err := nw.ConnectNetwork(ctx, netName, name, []string{ProxyAlias}); err != nil {
		return fmt.Errorf("connect proxy %q to %q: %w", name, netName, err)
	}
	if err := m.RT.StartVM(ctx, name); err != nil {
		return fmt.Errorf("start proxy %q: %w", name, err)
	}
	// Wait until it listens.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var out bytes.Buffer
		r, err := m.RT.Exec(ctx, name, ExecRequest{Cmd: []string{proxyBin, "proxy", "ping", "--addr", fmt.Sprintf("127.0.0.1:%d", ProxyPort)}, Stdout: &out, Stderr: &out})
		if err == nil && r.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			logs := ""
			if vm, ierr := m.RT.InspectVM(ctx, name); ierr == nil && vm.State != VMRunning {
				logs = fmt.Sprintf(" (it exited with code %d)", vm.ExitCode)
			}
			return fmt.Errorf("proxy %q did not start listening within 15 s%s: %v %s", name, logs, err, strings.TrimSpace(out.String()))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	ok = true
	return nil
}

// ensureProxyImage builds the proxy image (FROM scratch: the binary and the
// host's CA bundle) unless one with the same content exists.
func (m *Manager) ensureProxyImage(ctx context.Context) (string, error) {
	bin, err := os.ReadFile(m.InitBinary)
	if err != nil {
		return "", fmt.Errorf("proxy image: read %q: %w", m.InitBinary, err)
	}
	bundle := hostCABundle()
	h := sha256.New()
	h.Write(bin)
	h.Write([]byte{0})
	h.Write(bundle)
	tag := "agents-sandbox/proxy:" + hex.EncodeToString(h.Sum(nil))[:16]
	if img, err := m.RT.InspectImage(ctx, tag); err == nil {
		return img.ID, nil
	} else if !isNotFound(err) {
		return "", err
	}
	dockerfile := "FROM scratch\nCOPY agents-sandbox " + proxyBin + "\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("Dockerfile", 0o644, []byte(dockerfile)); err != nil {
		return "", err
	}
	if err := add("agents-sandbox", 0o755, bin); err != nil {
		return "", err
	}
	if err := add("ca-certificates.crt", 0o644, bundle); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	img, err := m.RT.BuildImage(ctx, BuildRequest{Context: &buf, DockerfilePath: "Dockerfile", Tags: []string{tag}, Labels: map[string]string{LabelKind: string(KindProxy), labelProxyImage: "1"}}, nil)
	if err != nil {
		return "", fmt.Errorf("build proxy image: %w", err)
	}
	return img.ID, nil
}

// hostCABundle returns the host's system CA bundle (empty if none found).
func hostCABundle() []byte {
	for _, f := range []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem", "/etc/ssl/ca-bundle.pem"} {
		if b, err := os.ReadFile(f); err == nil {
			return b
		}
	}
	return []byte{}
}

// installProxyCA puts the proxy's CA into the VM's trust store.
func (m *Manager) installProxyCA(ctx context.Context, p *Project, vm string) error {
	ca, err := proxy.LoadOrCreateCA(filepath.Join(p.Names.StateDir, "ca"))
	if err != nil {
		return fmt.Errorf("proxy CA: %w", err)
	}
	pem := ca.CertPEM()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := filepath.Dir(VMCAPath)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(VMCAPath, dir+"/"), Mode: 0o644, Size: int64(len(pem)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if _, err := tw.Write(pem); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	var out bytes.Buffer
	if _, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{"mkdir", "-p", dir}, User: "0:0", Stdout: &out, Stderr: &out}); err != nil {
		return fmt.Errorf("install proxy CA in %s: %w", vm, err)
	}
	if err := m.RT.CopyTo(ctx, vm, dir, &buf); err != nil {
		return fmt.Errorf("install proxy CA in %s: %w", vm, err)
	}
	// update-ca-certificates exists on Debian-like images; elsewhere append
	// to the bundle directly.
	script := `if command -v update-ca-certificates >/dev/null 2>&1; then update-ca-certificates >/dev/null 2>&1; fi
grep -q "$(sed -n 2p "$1")" "$2" 2>/dev/null || { mkdir -p "$(dirname "$2")"; cat "$1" >> "$2"; }`
	r, err := m.RT.Exec(ctx, vm, ExecRequest{Cmd: []string{"sh", "-c", script, "sh", VMCAPath, vmCABundle}, User: "0:0", Stdout: &out, Stderr: &out})
	if err != nil {
		return fmt.Errorf("install proxy CA in %s: %w", vm, err)
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("install proxy CA in %s: exit %d: %s", vm, r.ExitCode, strings.TrimSpace(out.String()))
	}
	return nil
}

// stopProxy stops the project's proxy container (if any).
func (m *Manager) stopProxy(ctx context.Context, p *Project) {
	name, _ := proxyNames(p)
	if err := m.RT.StopVM(ctx, name, 2*time.Second); err != nil && !isNotFound(err) {
		m.Log.Warn().Err(err).Str("proxy", name).Msg("could not stop the proxy")
	}
}

// removeProxy removes the project's proxy container and internal network.
func (m *Manager) removeProxy(ctx context.Context, p *Project) []string {
	var removed []string
	name, netName := proxyNames(p)
	if err := m.RT.RemoveVM(ctx, name, true); err == nil {
		removed = append(removed, "proxy "+name)
	}
	if nw, ok := m.RT.(Networker); ok {
		if err := nw.RemoveNetwork(ctx, netName); err == nil {
			removed = append(removed, "network "+netName)
		}
	}
	return removed
}

// AuditEvents returns up to n recent audit events of the project's proxy,
// newest last. A project without a proxy has none.
func (m *Manager) AuditEvents(ctx context.Context, p *Project, n int) ([]proxy.AuditEvent, error) {
	name, _ := proxyNames(p)
	rc, err := m.RT.CopyFrom(ctx, name, proxyAuditLog)
	if isNotFound(err) {
		return []proxy.AuditEvent{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read audit log of %q: %w", name, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		return []proxy.AuditEvent{}, nil
	}
	tmp, err := os.CreateTemp("", "agents-sandbox-audit-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, tr); err != nil {
		tmp.Close()
		return nil, err
	}
	tmp.Close()
	return proxy.ReadAuditLog(tmp.Name(), n)
}
