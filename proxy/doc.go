// Package proxy is agents-sandbox's host-side egress proxy: an HTTP forward proxy with CONNECT and
// TLS interception that swaps a secret's placeholder for its real value only on the way to a host
// that the secret names, enforces the egress policy, and records an audit trail.
//
// The VM never holds a secret. It sees an environment variable with a placeholder (NewPlaceholder)
// and HTTP_PROXY/HTTPS_PROXY pointing at this proxy, and trusts the proxy's per-checkout CA
// (LoadOrCreateCA). For every request the proxy:
//
//  1. requires the per-VM proxy credential (Options.Token) in Proxy-Authorization, else 407;
//  2. verifies the destination: for HTTPS the CONNECT target, the TLS SNI, the inner Host header and
//     the request URL must name the same host and port (else the handshake fails or the request gets
//     421); for plain HTTP the URL host and Host header must agree;
//  3. checks the egress policy (Policy, Rules) by name, and again on every resolved IP at dial time
//     (PolicyDialer), so DNS rebinding cannot reach private, loopback, link-local, CGNAT, unique-local
//     or cloud metadata addresses unless an IP/CIDR entry allows them explicitly;
//  4. substitutes placeholders found in header values (also inside a Basic credential), the URL path
//     and query, and, for secrets with Body set, the streamed request body; a placeholder headed for
//     a host its secret does not name stops the request with 403 and an audit event;
//  5. streams the response back without buffering (SSE, large downloads, WebSocket upgrades), and
//     masks the values it substituted if the upstream echoes them.
//
// Secret values never appear in logs, audit events, error responses or fmt/JSON output of the
// package's types (SecretValue prints [REDACTED]). Run is the entry point a container runs with a
// JSON Config.
package proxy
