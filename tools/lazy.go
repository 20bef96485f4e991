package tools

import (
	"context"
	"sync"
	"time"

	"github.com/agents-sandbox/agents-sandbox/proxy"
	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// LazyManager is a Core over a *sandbox.Manager whose runtime is connected
// on first use, so a server starts without a container engine and answers
// each call that needs one with ErrRuntimeUnavailable (CodeRuntimeUnavailable)
// until the engine is up. A failed connection is retried by the next call.
type LazyManager struct {
	// M is the manager; its RT may be nil until Connect succeeds.
	M *sandbox.Manager
	// Connect connects the runtime (docker.New, say). Errors should wrap
	// sandbox.ErrRuntimeUnavailable.
	Connect func(ctx context.Context) (sandbox.Runtime, error)

	mu sync.Mutex
}

func (l *LazyManager) ready(ctx context.Context) (*sandbox.Manager, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.M.RT == nil {
		rt, err := l.Connect(ctx)
		if err != nil {
			return nil, err
		}
		l.M.RT = rt
	}
	return l.M, nil
}

// Open resolves the project; it needs no runtime.
func (l *LazyManager) Open(o sandbox.OpenOptions) (*sandbox.Project, error) { return l.M.Open(o) }

// OpenProject resolves the project and migrates a legacy layout, which needs
// the runtime.
func (l *LazyManager) OpenProject(ctx context.Context, o sandbox.OpenOptions, dryRun bool) (*sandbox.Project, sandbox.MigrationReport, error) {
	m, err := l.ready(ctx)
	if err != nil {
		// Without an engine nothing can be migrated (and the call fails
		// on its first engine operation anyway): resolve the project so
		// that configuration and trust problems are reported first.
		p, err := l.M.Open(o)
		return p, sandbox.MigrationReport{}, err
	}
	return m.OpenProject(ctx, o, dryRun)
}

func (l *LazyManager) Create(ctx context.Context, p *sandbox.Project, o sandbox.CreateOptions) (sandbox.CreateResult, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.CreateResult{}, err
	}
	return m.Create(ctx, p, o)
}

func (l *LazyManager) Exec(ctx context.Context, p *sandbox.Project, o sandbox.ExecOptions) (sandbox.CommandResult, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.CommandResult{}, err
	}
	return m.Exec(ctx, p, o)
}

func (l *LazyManager) Attach(ctx context.Context, p *sandbox.Project, o sandbox.AttachOptions) (sandbox.CommandResult, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.CommandResult{}, err
	}
	return m.Attach(ctx, p, o)
}

func (l *LazyManager) Status(ctx context.Context, p *sandbox.Project) (sandbox.Status, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.Status{}, err
	}
	return m.Status(ctx, p)
}

func (l *LazyManager) Stop(ctx context.Context, p *sandbox.Project, timeout time.Duration) (sandbox.Status, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.Status{}, err
	}
	return m.Stop(ctx, p, timeout)
}

func (l *LazyManager) Kill(ctx context.Context, p *sandbox.Project) (sandbox.Status, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.Status{}, err
	}
	return m.Kill(ctx, p)
}

func (l *LazyManager) Remove(ctx context.Context, p *sandbox.Project, volume bool) (sandbox.RemoveResult, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.RemoveResult{}, err
	}
	return m.Remove(ctx, p, volume)
}

func (l *LazyManager) List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Listed, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return nil, err
	}
	return m.List(ctx, f)
}

func (l *LazyManager) SpawnTask(ctx context.Context, p *sandbox.Project, o sandbox.TaskOptions) (sandbox.TaskResult, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.TaskResult{}, err
	}
	return m.SpawnTask(ctx, p, o)
}

func (l *LazyManager) Provision(ctx context.Context, p *sandbox.Project) (sandbox.ProvisionResult, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.ProvisionResult{}, err
	}
	return m.Provision(ctx, p)
}

func (l *LazyManager) AuditEvents(ctx context.Context, p *sandbox.Project, n int) ([]proxy.AuditEvent, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return nil, err
	}
	return m.AuditEvents(ctx, p, n)
}

func (l *LazyManager) ProxyStatus(ctx context.Context, p *sandbox.Project) (sandbox.ProxyStatus, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.ProxyStatus{}, err
	}
	return m.ProxyStatus(ctx, p)
}

// SetSecret and RemoveSecret change the checkout's state; they need no
// runtime.
func (l *LazyManager) SetSecret(ctx context.Context, p *sandbox.Project, name string, s sandbox.SecretConfig) error {
	return l.M.SetSecret(ctx, p, name, s)
}

func (l *LazyManager) RemoveSecret(ctx context.Context, p *sandbox.Project, name string) error {
	return l.M.RemoveSecret(ctx, p, name)
}

var (
	_ SecretSetter  = (*LazyManager)(nil)
	_ ProxyStatuser = (*LazyManager)(nil)
	_ Core          = (*LazyManager)(nil)
	_ Provisioner   = (*LazyManager)(nil)
	_ AuditReader   = (*LazyManager)(nil)
)

// PlanCreate plans sandbox_create without changing anything.
func (l *LazyManager) PlanCreate(ctx context.Context, p *sandbox.Project, o sandbox.CreateOptions) (sandbox.CreatePlan, error) {
	m, err := l.ready(ctx)
	if err != nil {
		return sandbox.CreatePlan{}, err
	}
	return m.PlanCreate(ctx, p, o)
}
