package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestSecretValueNeverPrints(t *testing.T) {
	t.Parallel()
	s := Secret{Name: "T", Value: NewSecretValue("the-real-value"), Placeholder: NewPlaceholder("T"), Hosts: []string{"h"}}
	var outs []string
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		outs = append(outs, fmt.Sprintf(f, s), fmt.Sprintf(f, s.Value), fmt.Sprintf(f, &s))
	}
	j, _ := json.Marshal(s)
	outs = append(outs, string(j))
	var logs bytes.Buffer
	zl := zerolog.New(&logs)
	zl.Info().Interface("secret", s).Stringer("value", s.Value).Any("v", s.Value).Msg("x")
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "secret", s, "value", s.Value)
	outs = append(outs, logs.String())
	for _, o := range outs {
		if strings.Contains(o, "the-real-value") {
			t.Errorf("value printed: %s", o)
		}
	}
	if !strings.Contains(string(j), Redacted) || s.Value.Reveal() != "the-real-value" {
		t.Errorf("redaction or Reveal wrong: %s", j)
	}
}

func TestNewPlaceholder(t *testing.T) {
	t.Parallel()
	a, b := NewPlaceholder("GITHUB_TOKEN"), NewPlaceholder("GITHUB_TOKEN")
	if a == b || !strings.HasPrefix(a, PlaceholderPrefix+"GITHUB_TOKEN-") || len(a) != len(PlaceholderPrefix)+len("GITHUB_TOKEN-")+32 {
		t.Errorf("placeholders %q %q", a, b)
	}
	if p := NewPlaceholder("a-b.c"); !strings.HasPrefix(p, PlaceholderPrefix+"a_b_c-") {
		t.Errorf("name not sanitized: %q", p)
	}
	if url.QueryEscape(a) != a || url.PathEscape(a) != a {
		t.Errorf("placeholder needs escaping: %q", a)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Listen: "127.0.0.1:0", VM: "vm", CACert: "/ca.pem", CAKey: "/ca-key.pem", Token: "tok",
		Secrets: []Secret{{Name: "A", Value: NewSecretValue("real-a"), Placeholder: NewPlaceholder("A"), Hosts: []string{"a.example"}, Body: true}},
		Policy:  Policy{Mode: ModeProxy, Allow: []string{".pypi.org"}},
	}
	var buf bytes.Buffer
	if err := EncodeConfig(&buf, cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"real-a"`) {
		t.Fatalf("EncodeConfig did not write the value")
	}
	got, err := DecodeConfig(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got.Secrets[0].Value.Reveal() != "real-a" || got.Secrets[0].Placeholder != cfg.Secrets[0].Placeholder ||
		!got.Secrets[0].Body || got.Policy.Allow[0] != ".pypi.org" || got.Token != "tok" {
		t.Errorf("round trip lost data: %+v", got)
	}
	// Plain json.Marshal redacts, and the redacted copy is refused by New.
	j, _ := json.Marshal(cfg)
	if strings.Contains(string(j), "real-a") {
		t.Fatalf("json.Marshal wrote the value")
	}
	redacted, err := DecodeConfig(bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := LoadOrCreateCA(t.TempDir())
	if _, err := New(Options{CA: ca, Secrets: redacted.Secrets}); err == nil || !strings.Contains(err.Error(), "redacted") {
		t.Errorf("New with a redacted value: %v", err)
	}
	if _, err := DecodeConfig(strings.NewReader(`{"listen":":1","bogus":1}`)); err == nil {
		t.Errorf("unknown field accepted")
	}
}

func TestRunServesAndStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.startPlainUpstream(nil)
	caDir := t.TempDir()
	if _, err := LoadOrCreateCA(caDir); err != nil {
		t.Fatal(err)
	}
	sec := githubSecret("127.0.0.1")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := Config{
		Listen: "127.0.0.1:0", VM: "run-vm",
		CACert: filepath.Join(caDir, CACertFile), CAKey: filepath.Join(caDir, CAKeyFile),
		Token: "run-token", Secrets: []Secret{sec}, AuditLog: auditPath, LogLevel: "debug",
		Policy: Policy{Allow: []string{"127.0.0.1/32"}},
	}
	var cfgFile bytes.Buffer
	if err := EncodeConfig(&cfgFile, cfg); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "proxy.json")
	if err := os.WriteFile(path, cfgFile.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ReadConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, logs, func(a net.Addr) { ready <- a }) }()
	addr := waitChan(t, ready, "the proxy to listen")

	pu := &url.URL{Scheme: "http", Host: addr.String(), User: url.UserPassword("vm", "run-token")}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	resp, body := mustGet(t, c, "http://127.0.0.1:"+up.port+"/run", http.Header{"Authorization": {"Bearer " + sec.Placeholder}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s %q", resp.Status, body)
	}
	if got := up.requests()[0].Header.Get("Authorization"); got != "Bearer "+tokenValue {
		t.Errorf("upstream Authorization %q", got)
	}
	cancel()
	if err := waitChan(t, done, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(logs.String(), "proxy listening") || !strings.Contains(logs.String(), "proxy stopped") {
		t.Errorf("logs lack start/stop: %s", logs.String())
	}
	audit, _ := os.ReadFile(auditPath)
	if strings.Contains(logs.String(), tokenValue) || strings.Contains(string(audit), tokenValue) {
		t.Errorf("value in logs or audit")
	}
	events, err := ReadAuditLog(auditPath, 1)
	if err != nil || len(events) != 1 || events[0].Action != ActionSubstituted || events[0].VM != "run-vm" {
		t.Errorf("audit log: %+v, %v", events, err)
	}

	bad := cfg
	bad.CACert = filepath.Join(t.TempDir(), "missing.pem")
	if err := run(context.Background(), bad, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "CA") {
		t.Errorf("missing CA: %v", err)
	}
	bad = cfg
	bad.LogLevel = "loud"
	if err := run(context.Background(), bad, io.Discard, nil); err == nil {
		t.Errorf("bad log level accepted")
	}
}

func TestAuditRingAndFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "a", "audit.jsonl")
	a, err := openAuditLog(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := a.add(AuditEvent{Time: time.Unix(int64(i), 0).UTC(), Host: fmt.Sprint(i), Action: ActionRefused}); err != nil {
			t.Fatal(err)
		}
	}
	got := a.last(0)
	if len(got) != 3 || got[0].Host != "2" || got[2].Host != "4" {
		t.Errorf("ring: %+v", got)
	}
	if got := a.last(2); len(got) != 2 || got[0].Host != "3" {
		t.Errorf("last(2): %+v", got)
	}
	if err := a.close(); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %o", fi.Mode().Perm())
	}
	all, err := ReadAuditLog(path, 0)
	if err != nil || len(all) != 5 {
		t.Fatalf("ReadAuditLog: %d events, %v", len(all), err)
	}
	tail, _ := ReadAuditLog(path, 2)
	if len(tail) != 2 || tail[1].Host != "4" {
		t.Errorf("tail: %+v", tail)
	}
	if ev, err := ReadAuditLog(filepath.Join(t.TempDir(), "none"), 5); err != nil || ev != nil {
		t.Errorf("missing file: %v %v", ev, err)
	}
}

func TestResolveSecretValue(t *testing.T) {
	// Not parallel: it sets environment variables.
	ctx := context.Background()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("AS_TEST_SECRET", "  from-env\n")
	base := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "tok"), []byte("from-home\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "rel"), []byte("from-rel"), 0o600); err != nil {
		t.Fatal(err)
	}
	for from, want := range map[string]string{
		"env:AS_TEST_SECRET":                 "from-env",
		"file:~/tok":                         "from-home",
		"file:rel":                           "from-rel",
		"file:" + filepath.Join(base, "rel"): "from-rel",
		"command:printf ' from-cmd\\n'":      "from-cmd",
	} {
		got, err := ResolveSecretValue(ctx, from, base)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", from, got, err, want)
		}
	}
	for from, want := range map[string]string{
		"env:AS_TEST_UNSET_VARIABLE": "not set",
		"file:missing":               "no such file",
		"command:exit 3":             "exit status 3",
		"command:true":               "empty",
		"vault:x":                    "unknown kind",
		"nothing":                    "want env:NAME",
	} {
		_, err := ResolveSecretValue(ctx, from, base)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", from, err, want)
		}
	}
	// A failing command's stderr is quoted, unless it repeats what went to stdout.
	if err := os.WriteFile(filepath.Join(base, "s"), []byte("partial-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ResolveSecretValue(ctx, "command:cat s; echo 'not logged in' >&2; exit 1", base)
	if err == nil || !strings.Contains(err.Error(), "not logged in") || strings.Contains(err.Error(), "partial-secret") {
		t.Errorf("failing command: %v", err)
	}
	_, err = ResolveSecretValue(ctx, "command:cat s; cat s >&2; exit 1", base)
	if err == nil || strings.Contains(err.Error(), "partial-secret") {
		t.Errorf("stderr echoing stdout was quoted: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = ResolveSecretValue(short, "command:sleep 20", base)
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Errorf("slow command: %v", err)
	}
}

// TestResolveSecretValueEnv reads env sources, "~" and command environments from the given
// environ, never from the process's (so callers with their own environment, such as a Manager
// in a test, get what they configured).
func TestResolveSecretValueEnv(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "tok"), []byte("from-given-home\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := []string{"HOME=" + home, "AS_GIVEN=first", "AS_GIVEN=from-given-env", "PATH=" + os.Getenv("PATH")}
	for from, want := range map[string]string{
		"env:AS_GIVEN":                "from-given-env",
		"file:~/tok":                  "from-given-home",
		"command:printf %s $AS_GIVEN": "from-given-env",
	} {
		got, err := ResolveSecretValueEnv(ctx, from, t.TempDir(), environ)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", from, got, err, want)
		}
	}
	if _, err := ResolveSecretValueEnv(ctx, "env:PATH_IS_NOT_HERE", t.TempDir(), []string{"PATH=/bin"}); err == nil || !strings.Contains(err.Error(), "not set") {
		t.Errorf("missing variable: %v", err)
	}
	if _, err := ResolveSecretValueEnv(ctx, "file:~/tok", t.TempDir(), []string{}); err == nil || !strings.Contains(err.Error(), "HOME") {
		t.Errorf("no HOME: %v", err)
	}
}
