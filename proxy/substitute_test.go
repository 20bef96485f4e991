package proxy

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// fuzzSecrets are two secrets whose values hold characters ('!', '~', ' ') that no placeholder has,
// so a substitution can never form a new placeholder.
func fuzzSecrets(t testing.TB) []*secretRule {
	rules, err := compileSecrets([]Secret{
		{Name: "A", Value: NewSecretValue("val!A:1 2/+="), Placeholder: PlaceholderPrefix + "A-0123456789abcdef0123456789abcdef", Hosts: []string{"a.example"}},
		{Name: "B_2", Value: NewSecretValue("~B~"), Placeholder: PlaceholderPrefix + "B_2-fedcba9876543210fedcba9876543210", Hosts: []string{"b.example"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func FuzzSubstituteHeader(f *testing.F) {
	secrets := fuzzSecrets(f)
	a, b := secrets[0], secrets[1]
	f.Add("Bearer " + a.ph)
	f.Add(a.ph + "," + b.ph + a.ph)
	f.Add(basicAuth("user", a.ph))
	f.Add(basicAuth(b.ph, "p:"+a.ph))
	f.Add("basic  " + strings.TrimPrefix(basicAuth("u", b.ph), "Basic "))
	f.Add("Basic !!notbase64")
	f.Add("token " + a.ph[:20])
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		var found secretSet
		headerPlaceholders(secrets, v, &found)
		out := substituteHeaderValue(v, found)
		if len(found) == 0 {
			if out != v {
				t.Fatalf("no placeholder in %q, but it became %q", v, out)
			}
			return
		}
		_, outCred, outBasic := decodeBasic(out)
		for _, s := range secrets {
			if strings.Contains(out, s.ph) || outBasic && strings.Contains(outCred, s.ph) {
				t.Fatalf("placeholder of %s left in %q (from %q)", s.name, out, v)
			}
		}
		for _, s := range found {
			if !strings.Contains(out, s.value) && !(outBasic && strings.Contains(outCred, s.value)) {
				t.Fatalf("value of %s missing from %q (from %q)", s.name, out, v)
			}
		}
		// Scanning the result finds nothing more to substitute.
		var again secretSet
		headerPlaceholders(secrets, out, &again)
		if len(again) != 0 {
			t.Fatalf("result %q still holds placeholders", out)
		}
	})
}

func TestSubstituteRequest(t *testing.T) {
	t.Parallel()
	secrets := fuzzSecrets(t)
	a := secrets[0]
	u, _ := url.Parse("https://a.example/bot" + a.ph + "/send?k=" + a.ph + "&x=1")
	req := &http.Request{URL: u, Header: http.Header{
		"Authorization": {basicAuth("u", a.ph)},
		"Cookie":        {"s=" + a.ph + "; other=1"},
	}}
	found := requestPlaceholders(secrets, req)
	if len(found) != 1 || found[0] != a {
		t.Fatalf("found %v", found)
	}
	encoded := substituteRequest(req, found)
	if req.URL.Path != "/bot"+a.value+"/send" {
		t.Errorf("path %q", req.URL.Path)
	}
	if req.URL.Query().Get("k") != a.value || req.URL.Query().Get("x") != "1" {
		t.Errorf("query %q", req.URL.RawQuery)
	}
	if !strings.Contains(req.URL.String(), url.PathEscape(a.value)) {
		t.Errorf("URL %q lacks the path-escaped value", req.URL.String())
	}
	if _, pass, _ := (&http.Request{Header: req.Header}).BasicAuth(); pass != a.value {
		t.Errorf("basic password %q", pass)
	}
	if req.Header.Get("Cookie") != "s="+a.value+"; other=1" {
		t.Errorf("cookie %q", req.Header.Get("Cookie"))
	}
	if len(encoded) < 2 {
		t.Errorf("encoded forms %v: want the Basic token and the escaped value", encoded)
	}
}

func TestSecretValidation(t *testing.T) {
	t.Parallel()
	ph := NewPlaceholder("X")
	ok := Secret{Name: "X", Value: NewSecretValue("v4lue"), Placeholder: ph, Hosts: []string{"x.example"}}
	mod := func(f func(*Secret)) []Secret { s := ok; f(&s); return []Secret{s} }
	for name, c := range map[string]struct {
		secrets []Secret
		want    string
	}{
		"bad name":       {mod(func(s *Secret) { s.Name = "1X" }), "name"},
		"empty value":    {mod(func(s *Secret) { s.Value = SecretValue{} }), "empty value"},
		"redacted value": {mod(func(s *Secret) { s.Value = NewSecretValue(Redacted) }), "redacted"},
		"short ph":       {mod(func(s *Secret) { s.Placeholder = "short" }), "placeholder"},
		"no hosts":       {mod(func(s *Secret) { s.Hosts = nil }), "no hosts"},
		"bad host":       {mod(func(s *Secret) { s.Hosts = []string{"*.x.example"} }), "wildcards"},
		"duplicate":      {[]Secret{ok, ok}, "twice"},
		"nested ph":      {[]Secret{ok, {Name: "Y", Value: NewSecretValue("y"), Placeholder: ph + "-more", Hosts: []string{"y"}}}, "contains"},
		"value in ph":    {mod(func(s *Secret) { s.Value = NewSecretValue(ph[5:20]) }), "contain"},
	} {
		_, err := compileSecrets(c.secrets)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "v4lue") {
			t.Errorf("%s: error holds the value", name)
		}
	}
	anyHost := ok
	anyHost.Hosts, anyHost.AllowAnyHost = nil, true
	if _, err := compileSecrets([]Secret{anyHost}); err != nil {
		t.Errorf("allow any host: %v", err)
	}
}
