package proxy

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gofrs/flock"
)

// File names of the CA inside the directory given to LoadOrCreateCA.
const (
	CACertFile = "ca.pem"     // certificate, mode 0644; this is what the VM trusts
	CAKeyFile  = "ca-key.pem" // PKCS#8 private key, mode 0600; never enters the VM
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 30 * 24 * time.Hour
	leafRenew    = 24 * time.Hour // re-issue a cached leaf this close to its expiry
	leafCacheMax = 4096
)

// CA is the interception certificate authority of one checkout: it issues a leaf certificate for
// each host the VM connects to, cached in memory. It is safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
	leafKey *ecdsa.PrivateKey // shared by all leaves; lives only in memory

	mu    sync.Mutex
	cache map[string]*tls.Certificate
}

// LoadOrCreateCA loads the CA stored in dir (CACertFile and CAKeyFile), or, when either file is
// missing, generates a new one (ECDSA P-256, self-signed, valid ten years, common name
// "agents-sandbox CA <base name of dir>", so pass the checkout's state dir) and stores it: the
// directory with mode 0700, the key 0600, the certificate 0644, each written to a temporary file
// and renamed into place. Concurrent callers, also in other processes, serialize on a lock file in
// dir and all get the same CA. It fails when the files exist but do not hold a matching CA pair.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA dir %s: %w", dir, err)
	}
	lock := flock.New(filepath.Join(dir, "ca.lock"))
	if err := lock.Lock(); err != nil {
		return nil, fmt.Errorf("lock CA dir %s: %w", dir, err)
	}
	defer func() { _ = lock.Unlock() }()

	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	ca, err := LoadCA(certPath, keyPath)
	if err == nil {
		return ca, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	certPEM, keyPEM, err := generateCA("agents-sandbox CA " + filepath.Base(filepath.Clean(dir)))
	if err != nil {
		return nil, err
	}
	// The key first: a crash between the two renames leaves no certificate, so the next call
	// generates a fresh pair instead of loading a certificate without its key.
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM)
}

// LoadCA loads a CA from a PEM certificate file and a PEM private key file (PKCS#8, EC or
// PKCS#1). A missing file yields an error wrapping fs.ErrNotExist.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	ca, err := parseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certFile, err)
	}
	return ca, nil
}

func generateCA(commonName string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"agents-sandbox"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), nil
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse CA key pair: %w", err)
	}
	cert := pair.Leaf
	if cert == nil {
		if cert, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse CA certificate: %w", err)
		}
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certificate %q is not a CA", cert.Subject.CommonName)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key of type %T cannot sign", pair.PrivateKey)
	}
	switch key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey:
	default:
		return nil, fmt.Errorf("unsupported CA key type %T (want ECDSA or RSA)", key)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	return &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(block),
		key:     key,
		leafKey: leafKey,
		cache:   map[string]*tls.Certificate{},
	}, nil
}

// Certificate returns the CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// CertPEM returns the CA certificate, PEM-encoded: the file a VM adds to its trust stores.
func (c *CA) CertPEM() []byte { return append([]byte(nil), c.certPEM...) }

// CertPool returns a new pool holding only the CA certificate.
func (c *CA) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// LeafCertificate returns a certificate for host (a DNS name or an IP literal, no port) signed by
// the CA, valid 30 days, from the cache when one is there and not about to expire.
func (c *CA) LeafCertificate(host string) (*tls.Certificate, error) {
	host = normalizeHost(host)
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cert, ok := c.cache[host]; ok && now.Add(leafRenew).Before(cert.Leaf.NotAfter) {
		return cert, nil
	}
	cert, err := c.issue(host, now)
	if err != nil {
		return nil, err
	}
	if len(c.cache) >= leafCacheMax {
		for k := range c.cache { // evict an arbitrary entry
			delete(c.cache, k)
			break
		}
	}
	c.cache[host] = cert
	return cert, nil
}

func (c *CA) issue(host string, now time.Time) (*tls.Certificate, error) {
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host, Organization: []string{"agents-sandbox"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, ok := parseIPLiteral(host); ok {
		tmpl.IPAddresses = []net.IP{ip.AsSlice()}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, c.leafKey.Public(), c.key)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate for %s: %w", host, err)
	}
	return &tls.Certificate{
		Certificate: [][]byte{der, c.cert.Raw},
		PrivateKey:  c.leafKey,
		Leaf:        leaf,
	}, nil
}

func randomSerial() *big.Int {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b[:])
}

// writeFileAtomic writes data to a temporary file beside path with mode perm, syncs it and
// renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }()
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: chmod: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: rename: %w", path, err)
	}
	return nil
}
