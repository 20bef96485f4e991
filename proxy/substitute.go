package proxy

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// secretSet is the secrets found in a request, in the order of the compiled list.
type secretSet []*secretRule

func (s secretSet) has(r *secretRule) bool {
	for _, x := range s {
		if x == r {
			return true
		}
	}
	return false
}

func (s *secretSet) add(r *secretRule) {
	if !s.has(r) {
		*s = append(*s, r)
	}
}

// findPlaceholders adds to found the secrets whose placeholder occurs in v.
func findPlaceholders(secrets []*secretRule, v string, found *secretSet) {
	if !strings.Contains(v, PlaceholderPrefix) {
		// Fast path for placeholders made by NewPlaceholder; others are checked one by one.
		for _, s := range secrets {
			if !strings.HasPrefix(s.ph, PlaceholderPrefix) && strings.Contains(v, s.ph) {
				found.add(s)
			}
		}
		return
	}
	for _, s := range secrets {
		if strings.Contains(v, s.ph) {
			found.add(s)
		}
	}
}

// replacePlaceholders replaces the placeholder of each secret in use by escape(value).
func replacePlaceholders(v string, use secretSet, escape func(string) string) string {
	for _, s := range use {
		if strings.Contains(v, s.ph) {
			val := s.value
			if escape != nil {
				val = escape(val)
			}
			v = strings.ReplaceAll(v, s.ph, val)
		}
	}
	return v
}

// decodeBasic returns the decoded credential ("user:password") of a header value
// "Basic <base64>", with the original scheme spelling and whether it was one.
func decodeBasic(v string) (scheme, cred string, ok bool) {
	scheme, token, found := strings.Cut(strings.TrimSpace(v), " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(token))
	if err != nil {
		return "", "", false
	}
	return scheme, string(b), true
}

// headerPlaceholders adds to found the secrets whose placeholder occurs in a header value, also
// inside a Basic credential.
func headerPlaceholders(secrets []*secretRule, v string, found *secretSet) {
	findPlaceholders(secrets, v, found)
	if _, cred, ok := decodeBasic(v); ok {
		findPlaceholders(secrets, cred, found)
	}
}

// substituteHeaderValue replaces the placeholders of the secrets in use in a header value, also
// inside a Basic credential (decoded, replaced, re-encoded). A value without placeholders is
// returned unchanged.
func substituteHeaderValue(v string, use secretSet) string {
	v = replacePlaceholders(v, use, nil)
	if scheme, cred, ok := decodeBasic(v); ok {
		if repl := replacePlaceholders(cred, use, nil); repl != cred {
			v = scheme + " " + base64.StdEncoding.EncodeToString([]byte(repl))
		}
	}
	return v
}

// requestPlaceholders returns the secrets whose placeholder occurs in the header values, the
// escaped path or the raw query of req (not the body).
func requestPlaceholders(secrets []*secretRule, req *http.Request) secretSet {
	var found secretSet
	for _, vs := range req.Header {
		for _, v := range vs {
			headerPlaceholders(secrets, v, &found)
		}
	}
	findPlaceholders(secrets, req.URL.EscapedPath(), &found)
	findPlaceholders(secrets, req.URL.RawQuery, &found)
	return found
}

// substituteRequest replaces the placeholders of the secrets in use in req's header values
// (including Basic credentials), path (path-escaped) and query (query-escaped). It returns the
// encoded forms it produced that are not the plain value (a re-encoded Basic token, an escaped
// value) with what they replaced, so the response can be masked for those too.
func substituteRequest(req *http.Request, use secretSet) (encoded [][2]string) {
	for k, vs := range req.Header {
		for i, v := range vs {
			nv := substituteHeaderValue(v, use)
			if nv != v {
				if _, oldCred, ok := decodeBasic(v); ok && containsAny(oldCred, use) {
					encoded = append(encoded, [2]string{basicToken(nv), basicToken(v)})
				}
			}
			vs[i] = nv
		}
		req.Header[k] = vs
	}
	for _, s := range use {
		for _, esc := range []func(string) string{url.PathEscape, url.QueryEscape} {
			if e := esc(s.value); e != s.value {
				encoded = append(encoded, [2]string{e, s.ph})
			}
		}
	}
	if ep := req.URL.EscapedPath(); containsAny(ep, use) {
		raw := replacePlaceholders(ep, use, url.PathEscape)
		if p, err := url.PathUnescape(raw); err == nil {
			req.URL.Path, req.URL.RawPath = p, raw
		}
	}
	req.URL.RawQuery = replacePlaceholders(req.URL.RawQuery, use, url.QueryEscape)
	return encoded
}

// basicToken returns the base64 part of "Basic <token>".
func basicToken(v string) string {
	_, tok, _ := strings.Cut(strings.TrimSpace(v), " ")
	return strings.TrimSpace(tok)
}

func containsAny(v string, set secretSet) bool {
	for _, s := range set {
		if strings.Contains(v, s.ph) {
			return true
		}
	}
	return false
}

// maskHeader replaces each pair's first string by its second in every header value.
func maskHeader(h http.Header, pairs [][2]string) {
	for k, vs := range h {
		for i, v := range vs {
			for _, p := range pairs {
				v = strings.ReplaceAll(v, p[0], p[1])
			}
			vs[i] = v
		}
		h[k] = vs
	}
}
