// Package dockerfile holds the embedded default Dockerfile of agents-sandbox
// runner images and Docker's .dockerignore semantics for project build
// contexts. It knows nothing of agents-sandbox's own types: package sandbox
// turns its configuration into Params.
package dockerfile

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"text/template"
)

//go:embed Dockerfile.tmpl
var templateText string

// Packages are the Debian packages every default image gets.
var basePackages = []string{"bash", "ca-certificates", "curl", "git", "jq", "procps", "ripgrep"}

// nodePackages are added when the agent needs Node.js. Debian's and Ubuntu's
// own packages: images are built without access to other download sites.
var nodePackages = []string{"nodejs", "npm"}

// CACertDir is the directory of the build context holding the extra CA
// certificates (image.ca_certificates) as <NN>-<name>.crt files.
const CACertDir = "ca-certificates"

// ErrInvalid marks a Params value the template cannot be rendered with.
var ErrInvalid = errors.New("invalid Dockerfile parameters")

// Params are the inputs of the default Dockerfile.
type Params struct {
	// Base is the base image reference ("debian:bookworm-slim"); it must be
	// Debian or Ubuntu based (apt-get).
	Base string
	// Agent is the agent's name, for comments.
	Agent string
	// Install is shell run as root (bash -eo pipefail -c) after the common
	// tools are in; empty installs nothing. It may span several lines.
	Install string
	// NeedsNode adds Debian's nodejs and npm packages.
	NeedsNode bool
	// UID and GID are the dev user's ids, both > 0.
	UID, GID int
	// CACerts are the context-relative names of extra CA certificates under
	// CACertDir ("ca-certificates/01-corp.crt"); the context must hold them.
	CACerts []string
}

// imageRefRe is a permissive image reference: registry host and port,
// path, tag and digest, and nothing that the Dockerfile or a shell could
// read as syntax.
var imageRefRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:@-]*$`)

// agentNameRe matches the agent names package sandbox accepts.
var agentNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// Render returns the default Dockerfile for p. Errors wrap ErrInvalid: a
// base that is not an image reference, an agent name that is not lower-case
// [a-z0-9_.-], a uid or gid of 0 or less (dev must not be root).
func Render(p Params) ([]byte, error) {
	if !imageRefRe.MatchString(p.Base) {
		return nil, fmt.Errorf("render Dockerfile: %w: image.base %q is not an image reference like \"debian:bookworm-slim\"", ErrInvalid, p.Base)
	}
	if !agentNameRe.MatchString(p.Agent) {
		return nil, fmt.Errorf("render Dockerfile: %w: agent name %q must be lower-case letters, digits, '_', '.' or '-'", ErrInvalid, p.Agent)
	}
	if p.UID <= 0 || p.GID <= 0 {
		return nil, fmt.Errorf("render Dockerfile: %w: the dev user's uid and gid must be above 0 (got %d:%d)", ErrInvalid, p.UID, p.GID)
	}
	for _, c := range p.CACerts {
		if !strings.HasPrefix(c, CACertDir+"/") || strings.ContainsAny(c, "\n\r") {
			return nil, fmt.Errorf("render Dockerfile: %w: CA certificate %q must be a file under %s/", ErrInvalid, c, CACertDir)
		}
	}
	pkgs := append([]string{}, basePackages...)
	if p.NeedsNode {
		pkgs = append(pkgs, nodePackages...)
	}
	var install string
	if strings.TrimSpace(p.Install) != "" {
		// The JSON (exec) form carries any script, several lines included,
		// to bash unchanged: the Dockerfile parser reads it as a JSON array.
		parts := []string{"/bin/bash", "-eo", "pipefail", "-c", strings.TrimSpace(p.Install)}
		quoted := make([]string, len(parts))
		for i, s := range parts {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(s); err != nil {
				return nil, fmt.Errorf("render Dockerfile: encode install script: %w", err)
			}
			quoted[i] = strings.TrimSuffix(b.String(), "\n")
		}
		install = "[" + strings.Join(quoted, ", ") + "]"
	}
	tmpl, err := template.New("Dockerfile").Option("missingkey=error").Parse(templateText)
	if err != nil {
		return nil, fmt.Errorf("render Dockerfile: parse template: %w", err)
	}
	data := struct {
		Params
		Packages    string
		InstallJSON string
		CACertDir   string
	}{p, strings.Join(pkgs, " "), install, CACertDir}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		return nil, fmt.Errorf("render Dockerfile: %w", err)
	}
	return buf.Bytes(), nil
}
