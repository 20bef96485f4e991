package tools

import (
	"context"
	"fmt"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// ProvisionInput is the input of sandbox_provision.
type ProvisionInput struct {
	Target
}

// ProvisionedFile is one file provisioning wrote or found unchanged; never
// its content.
type ProvisionedFile struct {
	// Path is relative to /home/dev.
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Sha256 string `json:"sha256,omitempty"`
}

// HookRun is a startup hook's run.
type HookRun struct {
	Path     string `json:"path"`
	Root     bool   `json:"root"`
	ExitCode int    `json:"exit_code"`
	Output   string `json:"output"`
}

// ProvisionOutput reports what provisioning did.
type ProvisionOutput struct {
	VM        string            `json:"vm"`
	Written   []ProvisionedFile `json:"written"`
	Unchanged []ProvisionedFile `json:"unchanged"`
	Removed   []string          `json:"removed"`
	Hooks     []HookRun         `json:"hooks"`
	Warnings  []string          `json:"warnings"`
	// Config is the merged agent config (relative to /home/dev), "" when
	// no snippet exists.
	Config          string `json:"config,omitempty"`
	DaemonRestarted bool   `json:"daemon_restarted"`
}

func provisionOutput(vm string, r sandbox.ProvisionResult) ProvisionOutput {
	out := ProvisionOutput{VM: vm, Written: []ProvisionedFile{}, Unchanged: []ProvisionedFile{}, Removed: orEmpty(r.Removed),
		Hooks: []HookRun{}, Warnings: orEmpty(r.Warnings), Config: r.Config, DaemonRestarted: r.DaemonRestarted}
	for _, f := range r.Written {
		out.Written = append(out.Written, ProvisionedFile(f))
	}
	for _, f := range r.Unchanged {
		out.Unchanged = append(out.Unchanged, ProvisionedFile(f))
	}
	for _, h := range r.Hooks {
		out.Hooks = append(out.Hooks, HookRun(h))
	}
	return out
}

func (h *handlers) provisionTool() Tool {
	return define(Tool{
		Name:  "sandbox_provision",
		Title: "Provision the project's sandbox",
		Description: "Sync configuration into the running sandbox VM: merge the agent's config snippets (user, per-repo and project " +
			"layers) into the one config file the agent reads, copy the [home] mappings into /home/dev, and remove files an earlier " +
			"provisioning wrote whose source is gone. Idempotent. Returns every file written, unchanged or removed with sizes and " +
			"hashes, never contents. sandbox_create already provisions a VM it starts; call this after changing the config.",
		InputSchema: "sandbox_provision.input.json", OutputSchema: "sandbox_provision.output.json",
		Hints: Hints{ReadOnly: No, Destructive: Yes, Idempotent: Yes, OpenWorld: No},
	}, func(ctx context.Context, c Call, in *ProvisionInput) (ProvisionOutput, string, error) {
		const tool = "sandbox_provision"
		if h.Provisioner == nil {
			return ProvisionOutput{}, "", &Error{Code: CodeUnsupported, Kind: KindUnsupported, Tool: tool,
				Message: "provisioning is not available in this build of agents-sandbox; sandbox_create provisions the VM when it starts it"}
		}
		p, err := h.open(ctx, tool, in.Target)
		if err != nil {
			return ProvisionOutput{}, "", err
		}
		r, err := h.Provisioner.Provision(ctx, p)
		if err != nil {
			return ProvisionOutput{}, "", err
		}
		out := provisionOutput(p.Names.VM, r)
		return out, fmt.Sprintf("provisioned %s: %d written, %d unchanged, %d removed", out.VM, len(out.Written), len(out.Unchanged), len(out.Removed)), nil
	})
}
