package tools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/proxy"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// Core is what the tools need from the sandbox layer. *sandbox.Manager
// implements it; see the Manager's methods for shapes and errors.
type Core interface {
	Open(opts sandbox.OpenOptions) (*sandbox.Project, error)
	// OpenProject opens the project, migrates a legacy layout first (its
	// warnings go into the result text) and then checks trust.
	OpenProject(ctx context.Context, opts sandbox.OpenOptions, dryRun bool) (*sandbox.Project, sandbox.MigrationReport, error)
	Create(ctx context.Context, p *sandbox.Project, opts sandbox.CreateOptions) (sandbox.CreateResult, error)
	Exec(ctx context.Context, p *sandbox.Project, opts sandbox.ExecOptions) (sandbox.CommandResult, error)
	Attach(ctx context.Context, p *sandbox.Project, opts sandbox.AttachOptions) (sandbox.CommandResult, error)
	Status(ctx context.Context, p *sandbox.Project) (sandbox.Status, error)
	Stop(ctx context.Context, p *sandbox.Project, timeout time.Duration) (sandbox.Status, error)
	Kill(ctx context.Context, p *sandbox.Project) (sandbox.Status, error)
	Remove(ctx context.Context, p *sandbox.Project, volume bool) (sandbox.RemoveResult, error)
	List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Listed, error)
	SpawnTask(ctx context.Context, p *sandbox.Project, opts sandbox.TaskOptions) (sandbox.TaskResult, error)
}

// Planner is the core's dry run of sandbox_create.
type Planner interface {
	PlanCreate(ctx context.Context, p *sandbox.Project, opts sandbox.CreateOptions) (sandbox.CreatePlan, error)
}

// Provisioner is the core's on-demand provisioning (sandbox_provision).
type Provisioner interface {
	Provision(ctx context.Context, p *sandbox.Project) (sandbox.ProvisionResult, error)
}

// SecretSetter is the core's secret configuration (secret_proxy set and
// remove). Secret values never cross it: only names, references and hosts.
type SecretSetter interface {
	// SetSecret adds or replaces a secret in the project's configuration.
	SetSecret(ctx context.Context, p *sandbox.Project, name string, s sandbox.SecretConfig) error
	// RemoveSecret removes a secret from the project's configuration
	// (ErrNotFound when it has none by that name).
	RemoveSecret(ctx context.Context, p *sandbox.Project, name string) error
}

// ProxyStatuser reports the project's egress proxy (secret_proxy status).
type ProxyStatuser interface {
	ProxyStatus(ctx context.Context, p *sandbox.Project) (sandbox.ProxyStatus, error)
}

// AuditReader reads the project proxy's audit log (secret_proxy audit).
type AuditReader interface {
	// AuditEvents returns the newest n audit events, oldest first.
	AuditEvents(ctx context.Context, p *sandbox.Project, n int) ([]proxy.AuditEvent, error)
}

// Deps are what the tools are built from.
type Deps struct {
	Core Core
	// Provisioner, Secrets, Audit and Proxy default to Core when it
	// implements them; without one, the operation answers CodeUnsupported
	// (Proxy: status reports the configuration only).
	Provisioner Provisioner
	Secrets     SecretSetter
	Audit       AuditReader
	Proxy       ProxyStatuser
	// Worktrees lists worktree sessions for sandbox_status (default: Core
	// when it implements it; without one, status lists none).
	Worktrees WorktreeLister
	Log       zerolog.Logger
}

// All returns the registry of every tool over deps.
func All(d Deps) *Registry {
	if d.Provisioner == nil {
		d.Provisioner, _ = d.Core.(Provisioner)
	}
	if d.Secrets == nil {
		d.Secrets, _ = d.Core.(SecretSetter)
	}
	if d.Audit == nil {
		d.Audit, _ = d.Core.(AuditReader)
	}
	if d.Proxy == nil {
		d.Proxy, _ = d.Core.(ProxyStatuser)
	}
	if d.Worktrees == nil {
		d.Worktrees, _ = d.Core.(WorktreeLister)
	}
	h := &handlers{Deps: d}
	return NewRegistry(
		h.createTool(),
		h.provisionTool(),
		h.attachTool(),
		h.spawnTaskTool(),
		h.secretProxyTool(),
		h.execTool(),
		h.listTool(),
		h.statusTool(),
		h.stopTool(),
		h.removeTool(),
	)
}

// handlers hold the dependencies the tool handlers share.
type handlers struct{ Deps }

// Target selects the project (the checkout and the agent) for a tool that
// applies the project's configuration.
type Target struct {
	// Checkout is an absolute path of a directory inside the project.
	Checkout string `json:"checkout"`
	// Agent overrides the project's configured agent.
	Agent string `json:"agent,omitempty"`
	// Trust accepts the checkout's own configuration of secrets, home
	// mappings, mounts and wider egress (sandbox.ErrUntrusted).
	Trust bool `json:"trust,omitempty"`
}

// InspectTarget selects the project for a tool that only looks at or stops
// things: it needs no trust.
type InspectTarget struct {
	Checkout string `json:"checkout"`
	Agent    string `json:"agent,omitempty"`
}

func (t InspectTarget) target() Target { return Target{Checkout: t.Checkout, Agent: t.Agent} }

// open checks the target and opens the project; inspect skips the trust
// check (for tools that apply no configuration).
func (h *handlers) open(ctx context.Context, tool string, t Target) (*sandbox.Project, error) {
	return h.openWith(ctx, tool, t, false, false)
}

func (h *handlers) inspect(ctx context.Context, tool string, t InspectTarget) (*sandbox.Project, error) {
	return h.openWith(ctx, tool, t.target(), true, false)
}

// openWith opens the project; inspect skips the trust check, dryRun makes
// the migration of a legacy layout a dry run (and skips trust too).
func (h *handlers) openWith(ctx context.Context, tool string, t Target, inspect, dryRun bool) (*sandbox.Project, error) {
	if !filepath.IsAbs(t.Checkout) {
		return nil, InvalidParams(tool, "/checkout", "checkout must be an absolute path, got %q; pass the absolute path of a directory inside the project", t.Checkout)
	}
	fi, err := os.Stat(t.Checkout)
	if err != nil {
		return nil, &Error{Code: CodeNotFound, Kind: KindNotFound, Tool: tool, Pointer: "/checkout", Err: err,
			Message: fmt.Sprintf("checkout %q does not exist (%v); pass the absolute path of an existing project directory", t.Checkout, errors.Unwrap(err))}
	}
	if !fi.IsDir() {
		return nil, InvalidParams(tool, "/checkout", "checkout %q is not a directory; pass the project's directory, not a file in it", t.Checkout)
	}
	p, rep, err := h.Core.OpenProject(ctx, sandbox.OpenOptions{Dir: t.Checkout, Agent: t.Agent, Trust: t.Trust, SkipTrust: inspect}, dryRun)
	addWarnings(ctx, rep.Warnings)
	if err != nil {
		if errors.Is(err, sandbox.ErrUntrusted) {
			return nil, &Error{Code: CodeUntrusted, Kind: KindUntrusted, Tool: tool, Err: err,
				Message: err.Error() + ". Show the user those settings and ask; only when they accept them call " + tool + " again with trust: true"}
		}
		if t.Agent != "" && errors.Is(err, sandbox.ErrInvalid) && strings.HasPrefix(err.Error(), fmt.Sprintf("agent %q", t.Agent)) {
			e := InvalidParams(tool, "/agent", "%s", err.Error())
			e.Err = err
			return nil, e
		}
		if errors.Is(err, sandbox.ErrInvalid) {
			return nil, &Error{Code: CodeInvalidConfig, Kind: KindInvalidConfig, Tool: tool, Err: err,
				Message: "the project's configuration is invalid: " + err.Error() + "; fix the file it names (agents-sandbox config show prints the merged configuration)"}
		}
		return nil, fmt.Errorf("open project %q: %w", t.Checkout, err)
	}
	h.Log.Debug().Str("tool", tool).Str("checkout", p.ID.CheckoutSlug).Str("agent", p.Names.Agent).Bool("trust", t.Trust).Msg("project opened")
	return p, nil
}

// ProjectInfo identifies the project a result is about.
type ProjectInfo struct {
	ProjectDir   string `json:"project_dir"`
	CheckoutSlug string `json:"checkout_slug"`
	RepoSlug     string `json:"repo_slug"`
	Agent        string `json:"agent"`
}

func projectInfo(p *sandbox.Project) ProjectInfo {
	return ProjectInfo{ProjectDir: p.ID.ProjectDir, CheckoutSlug: p.ID.CheckoutSlug, RepoSlug: p.ID.RepoSlug, Agent: p.Names.Agent}
}

// parseEnv turns KEY=VALUE strings into a map; pointer is the array's.
func parseEnv(tool, pointer string, env []string) (map[string]string, error) {
	if len(env) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(env))
	for i, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !validEnvName(k) {
			return nil, InvalidParams(tool, fmt.Sprintf("%s/%d", pointer, i), "env entry %q must be NAME=VALUE with NAME made of letters, digits and _", kv)
		}
		m[k] = v
	}
	return m, nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// ts formats a time for output: RFC 3339 in UTC, "" for the zero time.
func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func seconds(n int) time.Duration { return time.Duration(n) * time.Second }

func sortedLabels(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

var (
	_ Core          = (*sandbox.Manager)(nil)
	_ Provisioner   = (*sandbox.Manager)(nil)
	_ AuditReader   = (*sandbox.Manager)(nil)
	_ SecretSetter  = (*sandbox.Manager)(nil)
	_ ProxyStatuser = (*sandbox.Manager)(nil)
)

// warningsKey holds the per-call warning list (request-scoped data, not a
// dependency): migration warnings gathered while a handler runs, which
// Tool.Call puts at the head of the result text.
type warningsKey struct{}

func withWarnings(ctx context.Context) (context.Context, *[]string) {
	w := &[]string{}
	return context.WithValue(ctx, warningsKey{}, w), w
}

func addWarnings(ctx context.Context, ws []string) {
	if w, ok := ctx.Value(warningsKey{}).(*[]string); ok {
		*w = append(*w, ws...)
	}
}
