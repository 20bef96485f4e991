package proxy

import (
	"bytes"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestLoadOrCreateCA(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "myrepo-1a2b3c")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := ca.Certificate().Subject.CommonName; got != "agents-sandbox CA myrepo-1a2b3c" {
		t.Errorf("common name %q", got)
	}
	if !ca.Certificate().IsCA || ca.Certificate().NotAfter.Before(time.Now().Add(5*365*24*time.Hour)) {
		t.Errorf("CA flags or validity wrong: IsCA=%v NotAfter=%v", ca.Certificate().IsCA, ca.Certificate().NotAfter)
	}
	for name, want := range map[string]os.FileMode{CACertFile: 0o644, CAKeyFile: 0o600, ".": 0o700} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %o, want %o", name, fi.Mode().Perm(), want)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != CACertFile && e.Name() != CAKeyFile && e.Name() != "ca.lock" {
			t.Errorf("stray file %s", e.Name())
		}
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Certificate().Equal(ca.Certificate()) {
		t.Errorf("second load generated a new CA")
	}
	onDisk, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	if !bytes.Equal(onDisk, ca.CertPEM()) {
		t.Errorf("CertPEM differs from ca.pem")
	}
}

func TestLoadOrCreateCAConcurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cas := make([]*CA, 6)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			ca, err := LoadOrCreateCA(dir)
			if err != nil {
				t.Error(err)
				return
			}
			cas[i] = ca
		})
	}
	wg.Wait()
	for _, ca := range cas[1:] {
		if ca == nil || !ca.Certificate().Equal(cas[0].Certificate()) {
			t.Fatalf("concurrent callers got different CAs")
		}
	}
}

func TestLoadCAErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := LoadCA(filepath.Join(dir, "nope.pem"), filepath.Join(dir, "nope-key.pem")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing files: %v, want fs.ErrNotExist", err)
	}
	a, b := t.TempDir(), t.TempDir()
	if _, err := LoadOrCreateCA(a); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(b); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(filepath.Join(a, CACertFile), filepath.Join(b, CAKeyFile)); err == nil {
		t.Errorf("mismatched pair accepted")
	}
	// A damaged pair is an error, not silently replaced.
	if err := os.WriteFile(filepath.Join(a, CAKeyFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(a); err == nil {
		t.Errorf("damaged key accepted")
	}
	// A missing certificate (crash between the renames) regenerates the pair.
	if err := os.Remove(filepath.Join(b, CACertFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(b); err != nil {
		t.Errorf("regenerate after a missing certificate: %v", err)
	}
}

func TestLeafCertificate(t *testing.T) {
	t.Parallel()
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := ca.CertPool()
	for _, host := range []string{"api.github.com", "127.0.0.1", "::1"} {
		cert, err := ca.LeafCertificate(host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
		again, _ := ca.LeafCertificate(host)
		if again != cert {
			t.Errorf("%s: not cached", host)
		}
	}
	cert, _ := ca.LeafCertificate("API.GitHub.com.")
	if cert.Leaf.Subject.CommonName != "api.github.com" {
		t.Errorf("host not normalized: %q", cert.Leaf.Subject.CommonName)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: "evil.com", Roots: roots}); err == nil {
		t.Errorf("leaf valid for another host")
	}
}
