package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Redacted is what SecretValue prints instead of the value.
const Redacted = "[REDACTED]"

// SecretValue holds a secret's real value. Every way of printing or encoding it (String,
// GoString, MarshalText, MarshalJSON, slog's LogValue) yields "[REDACTED]"; only Reveal returns the
// value. UnmarshalJSON accepts the plain value, so a config written by EncodeConfig reads back.
// The zero SecretValue is empty.
type SecretValue struct {
	v string
}

// NewSecretValue wraps a real value.
func NewSecretValue(v string) SecretValue { return SecretValue{v: v} }

// Reveal returns the real value. Call it only where the value is sent to an allowed host.
func (s SecretValue) Reveal() string { return s.v }

// IsZero reports whether the value is empty.
func (s SecretValue) IsZero() bool { return s.v == "" }

func (s SecretValue) String() string                { return Redacted }
func (s SecretValue) GoString() string              { return Redacted }
func (s SecretValue) MarshalText() ([]byte, error)  { return []byte(Redacted), nil }
func (s SecretValue) MarshalJSON() ([]byte, error)  { return json.Marshal(Redacted) }
func (s SecretValue) LogValue() slog.Value          { return slog.StringValue(Redacted) }
func (s *SecretValue) UnmarshalText(b []byte) error { s.v = string(b); return nil }

// UnmarshalJSON reads a JSON string holding the plain value.
func (s *SecretValue) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("decode secret value: want a JSON string")
	}
	s.v = v
	return nil
}

// Secret is one secret as the proxy handles it.
type Secret struct {
	// Name is the environment variable name the VM sees, [A-Za-z_][A-Za-z0-9_]*.
	Name string `json:"name"`
	// Value is the real value, resolved on the host (see ResolveSecretValue).
	Value SecretValue `json:"value"`
	// Placeholder is what the VM holds instead of the value (see NewPlaceholder). At least 24
	// characters, and no placeholder may contain another.
	Placeholder string `json:"placeholder"`
	// Hosts are the host patterns (see HostList) the value may be sent to. Required unless
	// AllowAnyHost is set.
	Hosts []string `json:"hosts,omitempty"`
	// Body enables substitution in request bodies (streaming; the upload becomes chunked).
	Body bool `json:"body,omitempty"`
	// AllowAnyHost (allow_any_host_dangerous in the config file) sends the value to any host the
	// egress policy allows. The proxy logs a warning for it at start.
	AllowAnyHost bool `json:"allow_any_host_dangerous,omitempty"`
}

// PlaceholderPrefix starts every placeholder made by NewPlaceholder.
const PlaceholderPrefix = "agents-sandbox-placeholder-"

// NewPlaceholder returns a fresh random placeholder for the secret called name:
// "agents-sandbox-placeholder-<NAME>-<32 hex digits>" (128 random bits, so it never occurs by
// chance). Characters of name outside [A-Za-z0-9_] become '_'. The result only holds characters
// that need no escaping in URLs, headers or JSON.
func NewPlaceholder(name string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	clean := strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
	return PlaceholderPrefix + clean + "-" + hex.EncodeToString(b[:])
}

const minPlaceholderLen = 24

// secretRule is a validated, compiled Secret.
type secretRule struct {
	name    string
	value   string
	ph      string
	hosts   HostList
	body    bool
	anyHost bool
}

// destVerdict is what a secret's hosts say about a destination.
type destVerdict int

const (
	verdictDeny destVerdict = iota
	verdictAllow
	// verdictIfIP: the destination name matches no name pattern, but the secret has CIDR patterns
	// that the address resolved at dial time may match.
	verdictIfIP
)

func (s *secretRule) verdict(d destination) destVerdict {
	switch {
	case s.anyHost:
		return verdictAllow
	case d.ip.IsValid():
		if s.hosts.MatchIP(d.ip) {
			return verdictAllow
		}
		return verdictDeny
	case s.hosts.MatchName(d.host):
		return verdictAllow
	case s.hosts.HasCIDR():
		return verdictIfIP
	}
	return verdictDeny
}

func validSecretName(n string) bool {
	if n == "" {
		return false
	}
	for i, c := range n {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// compileSecrets validates secrets and compiles their host lists. Errors name the secret, never
// its value.
func compileSecrets(secrets []Secret) ([]*secretRule, error) {
	rules := make([]*secretRule, 0, len(secrets))
	names := map[string]bool{}
	for _, s := range secrets {
		if !validSecretName(s.Name) {
			return nil, fmt.Errorf("secret %q: name must match [A-Za-z_][A-Za-z0-9_]*", s.Name)
		}
		if names[s.Name] {
			return nil, fmt.Errorf("secret %s: defined twice", s.Name)
		}
		names[s.Name] = true
		v := s.Value.Reveal()
		switch {
		case v == "":
			return nil, fmt.Errorf("secret %s: empty value", s.Name)
		case v == Redacted:
			return nil, fmt.Errorf("secret %s: the value is %q, a redacted copy: encode configs with EncodeConfig", s.Name, Redacted)
		case len(s.Placeholder) < minPlaceholderLen:
			return nil, fmt.Errorf("secret %s: placeholder shorter than %d characters: make it with NewPlaceholder", s.Name, minPlaceholderLen)
		case strings.Contains(v, s.Placeholder) || strings.Contains(s.Placeholder, v):
			return nil, fmt.Errorf("secret %s: the placeholder and the value contain one another", s.Name)
		case len(s.Hosts) == 0 && !s.AllowAnyHost:
			return nil, fmt.Errorf("secret %s: no hosts: name the hosts it may be sent to (or set allow_any_host_dangerous)", s.Name)
		}
		hosts, err := ParseHostList(s.Hosts)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.Name, err)
		}
		rules = append(rules, &secretRule{
			name: s.Name, value: v, ph: s.Placeholder, hosts: hosts, body: s.Body, anyHost: s.AllowAnyHost,
		})
	}
	for _, a := range rules {
		for _, b := range rules {
			if a != b && strings.Contains(a.ph, b.ph) {
				return nil, fmt.Errorf("secrets %s and %s: placeholder of %s contains that of %s", a.name, b.name, a.name, b.name)
			}
		}
	}
	slices.SortFunc(rules, func(a, b *secretRule) int { return strings.Compare(a.name, b.name) })
	return rules, nil
}
