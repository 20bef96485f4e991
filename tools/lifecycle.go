package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// CreateInput is the input of sandbox_create.
type CreateInput struct {
	Target
	// Rebuild builds the image even when its content hash is unchanged.
	Rebuild bool `json:"rebuild,omitempty"`
	// DryRun reports what the call (and the migration of a legacy layout)
	// would do and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// Timings are how long each phase of sandbox_create took, in milliseconds.
type Timings struct {
	Image     int64 `json:"image,omitempty"`
	Volume    int64 `json:"volume,omitempty"`
	Egress    int64 `json:"egress,omitempty"`
	VM        int64 `json:"vm,omitempty"`
	Provision int64 `json:"provision,omitempty"`
	Daemon    int64 `json:"daemon,omitempty"`
	Total     int64 `json:"total"`
}

// CreateOutput reports what sandbox_create did.
type CreateOutput struct {
	Project       ProjectInfo      `json:"project"`
	VM            string           `json:"vm"`
	Image         string           `json:"image"`
	ImageID       string           `json:"image_id"`
	ImageBuilt    bool             `json:"image_built"`
	HomeVolume    string           `json:"home_volume"`
	VolumeCreated bool             `json:"volume_created"`
	Action        string           `json:"action"`
	User          string           `json:"user"`
	Provision     *ProvisionOutput `json:"provision,omitempty"`
	Warnings      []string         `json:"warnings"`
	// DryRun is true when nothing was changed; Changes then lists what a
	// real call would do, in order.
	DryRun    bool     `json:"dry_run,omitempty"`
	Changes   []string `json:"changes,omitempty"`
	TimingsMS Timings  `json:"timings_ms"`
}

func (h *handlers) createTool() Tool {
	return define(Tool{
		Name:  "sandbox_create",
		Title: "Create or start the project's sandbox",
		Description: "Make sure the project's sandbox VM exists and runs: build the runner image if its inputs changed " +
			"(progress is reported line by line), create the persistent home volume on first use, create, start or reuse the VM " +
			"(a changed configuration recreates it and keeps the home volume), provision it and start the agent's daemon. " +
			"Call it before sandbox_exec or sandbox_attach; it is fast when everything is current. Returns what was built, " +
			"created or reused, and timings.",
		InputSchema: "sandbox_create.input.json", OutputSchema: "sandbox_create.output.json",
		Hints: Hints{ReadOnly: No, Destructive: No, Idempotent: Yes, OpenWorld: Yes},
	}, func(ctx context.Context, c Call, in *CreateInput) (CreateOutput, string, error) {
		if in.DryRun {
			return h.createDryRun(ctx, in)
		}
		p, err := h.open(ctx, "sandbox_create", in.Target)
		if err != nil {
			return CreateOutput{}, "", err
		}
		rep := newReporter(c)
		r, err := h.Core.Create(ctx, p, sandbox.CreateOptions{Rebuild: in.Rebuild, Progress: rep.line})
		if err != nil {
			return CreateOutput{}, "", err
		}
		out := CreateOutput{Project: projectInfo(p), VM: r.VM, Image: r.Image, ImageID: r.ImageID, ImageBuilt: r.ImageBuilt,
			HomeVolume: r.HomeVolume, VolumeCreated: r.VolumeCreated, Action: string(r.Action), User: r.User,
			Warnings: orEmpty(r.Warnings), TimingsMS: timings(r.TimingsMS)}
		if r.Provision != nil {
			po := provisionOutput(r.VM, *r.Provision)
			out.Provision = &po
		}
		var parts []string
		parts = append(parts, fmt.Sprintf("VM %s %s", r.VM, r.Action))
		if r.ImageBuilt {
			parts = append(parts, "image built")
		} else {
			parts = append(parts, "image reused")
		}
		if r.VolumeCreated {
			parts = append(parts, "home volume "+r.HomeVolume+" created")
		}
		text := strings.Join(parts, "; ") + fmt.Sprintf(" (%d ms)", out.TimingsMS.Total)
		for _, w := range out.Warnings {
			text += "\nwarning: " + w
		}
		return out, text, nil
	})
}

// createDryRun is sandbox_create with dry_run: the migration and the run
// are planned against the real engine, which is only read.
func (h *handlers) createDryRun(ctx context.Context, in *CreateInput) (CreateOutput, string, error) {
	const tool = "sandbox_create"
	planner, ok := h.Core.(Planner)
	if !ok {
		return CreateOutput{}, "", &Error{Code: CodeUnsupported, Kind: KindUnsupported, Tool: tool, Message: "dry_run is not supported by this server"}
	}
	p, err := h.openWith(ctx, tool, in.Target, true, true)
	if err != nil {
		return CreateOutput{}, "", err
	}
	plan, err := planner.PlanCreate(ctx, p, sandbox.CreateOptions{Rebuild: in.Rebuild})
	if err != nil {
		return CreateOutput{}, "", err
	}
	out := CreateOutput{Project: projectInfo(p), VM: plan.VM.Name, Image: plan.Image.Ref, ImageID: plan.Image.ID,
		ImageBuilt: plan.Image.Action == sandbox.PlanBuild, HomeVolume: plan.HomeVolume.Name,
		VolumeCreated: plan.HomeVolume.Action == sandbox.PlanNew, Action: string(plan.VM.Action),
		Warnings: orEmpty(append(append([]string{}, plan.Migration.Warnings...), plan.Warnings...)),
		DryRun:   true, Changes: orEmpty(plan.Changes)}
	text := "dry run, nothing was changed; a real call would:"
	if len(plan.Changes) == 0 {
		text = "dry run, nothing was changed; everything is up to date"
	}
	for _, c := range plan.Changes {
		text += "\n- " + c
	}
	return out, text, nil
}

func timings(m map[string]int64) Timings {
	return Timings{Image: m["image"], Volume: m["volume"], Egress: m["egress"], VM: m["vm"], Provision: m["provision"], Daemon: m["daemon"], Total: m["total"]}
}

// StatusInput is the input of sandbox_status.
type StatusInput struct {
	InspectTarget
}

// StatusOutput is the state of the project's VM.
type StatusOutput struct {
	Project     ProjectInfo `json:"project"`
	VM          string      `json:"vm"`
	State       string      `json:"state"`
	Image       string      `json:"image"`
	ImageID     string      `json:"image_id,omitempty"`
	HomeVolume  string      `json:"home_volume,omitempty"`
	User        string      `json:"user,omitempty"`
	Network     string      `json:"network,omitempty"`
	Created     string      `json:"created,omitempty"`
	StartedAt   string      `json:"started_at,omitempty"`
	LastUsed    string      `json:"last_used,omitempty"`
	Fingerprint string      `json:"fingerprint,omitempty"`
	Legacy      bool        `json:"legacy"`
}

func statusOutput(p *sandbox.Project, s sandbox.Status) StatusOutput {
	return StatusOutput{Project: projectInfo(p), VM: s.VM, State: string(s.State), Image: s.Image, ImageID: s.ImageID,
		HomeVolume: s.HomeVolume, User: s.User, Network: s.Network, Created: ts(s.Created), StartedAt: ts(s.StartedAt),
		LastUsed: ts(s.LastUsed), Fingerprint: s.Fingerprint, Legacy: s.Legacy}
}

func statusText(s StatusOutput) string {
	t := fmt.Sprintf("VM %s is %s", s.VM, s.State)
	if s.HomeVolume != "" {
		t += "; home volume " + s.HomeVolume
	}
	return t
}

func (h *handlers) statusTool() Tool {
	return define(Tool{
		Name:  "sandbox_status",
		Title: "Show the state of the project's sandbox",
		Description: "Report the project's sandbox VM for the agent: its state (running, stopped, missing, ...), image, home volume, " +
			"user, network and times, and, while it runs, its worktree sessions (branch, base, ahead/behind, dirty). " +
			"Changes nothing; a VM that does not exist is state \"missing\", not an error.",
		InputSchema: "sandbox_status.input.json", OutputSchema: "sandbox_status.output.json",
		Hints: Hints{ReadOnly: Yes, Destructive: No, Idempotent: Yes, OpenWorld: No},
	}, func(ctx context.Context, c Call, in *StatusInput) (StatusToolOutput, string, error) {
		p, err := h.inspect(ctx, "sandbox_status", in.InspectTarget)
		if err != nil {
			return StatusToolOutput{}, "", err
		}
		s, err := h.Core.Status(ctx, p)
		if err != nil {
			return StatusToolOutput{}, "", err
		}
		out := StatusToolOutput{StatusOutput: statusOutput(p, s), Worktrees: h.statusWorktrees(ctx, p, s)}
		text := statusText(out.StatusOutput)
		if n := len(out.Worktrees); n > 0 {
			text += "; " + plural(n, "worktree session", "worktree sessions")
		}
		return out, text, nil
	})
}

// StopInput is the input of sandbox_stop.
type StopInput struct {
	InspectTarget
	// TimeoutSeconds is how long to wait after SIGTERM before SIGKILL
	// (default 10).
	TimeoutSeconds *int `json:"timeout_seconds,omitempty"`
	// Kill sends SIGKILL at once.
	Kill bool `json:"kill,omitempty"`
}

func (h *handlers) stopTool() Tool {
	return define(Tool{
		Name:  "sandbox_stop",
		Title: "Stop the project's sandbox",
		Description: "Stop the project's sandbox VM (SIGTERM, then SIGKILL after timeout_seconds; kill: at once) and its proxy. " +
			"The VM and its home volume stay; sandbox_create or sandbox_exec starts it again. Stopping a stopped or missing VM is not an error.",
		InputSchema: "sandbox_stop.input.json", OutputSchema: "sandbox_stop.output.json",
		Hints: Hints{ReadOnly: No, Destructive: Yes, Idempotent: Yes, OpenWorld: No},
	}, func(ctx context.Context, c Call, in *StopInput) (StatusOutput, string, error) {
		p, err := h.inspect(ctx, "sandbox_stop", in.InspectTarget)
		if err != nil {
			return StatusOutput{}, "", err
		}
		var s sandbox.Status
		if in.Kill {
			s, err = h.Core.Kill(ctx, p)
		} else {
			timeout := 10
			if in.TimeoutSeconds != nil {
				timeout = *in.TimeoutSeconds
			}
			s, err = h.Core.Stop(ctx, p, seconds(timeout))
		}
		if err != nil {
			return StatusOutput{}, "", err
		}
		out := statusOutput(p, s)
		return out, statusText(out), nil
	})
}

// RemoveInput is the input of sandbox_remove.
type RemoveInput struct {
	InspectTarget
	// Volume also removes the persistent home volume (everything the agent
	// kept in /home/dev).
	Volume bool `json:"volume,omitempty"`
}

// RemoveOutput lists what was removed.
type RemoveOutput struct {
	Removed []string `json:"removed"`
}

func (h *handlers) removeTool() Tool {
	return define(Tool{
		Name:  "sandbox_remove",
		Title: "Remove the project's sandbox",
		Description: "Remove the project's sandbox VM (running or not), its proxy and network. With volume: true also the persistent " +
			"home volume, which deletes everything the agent kept in /home/dev. The checkout itself is never touched.",
		InputSchema: "sandbox_remove.input.json", OutputSchema: "sandbox_remove.output.json",
		Hints: Hints{ReadOnly: No, Destructive: Yes, Idempotent: Yes, OpenWorld: No},
	}, func(ctx context.Context, c Call, in *RemoveInput) (RemoveOutput, string, error) {
		p, err := h.inspect(ctx, "sandbox_remove", in.InspectTarget)
		if err != nil {
			return RemoveOutput{}, "", err
		}
		r, err := h.Core.Remove(ctx, p, in.Volume)
		if err != nil {
			return RemoveOutput{}, "", err
		}
		out := RemoveOutput{Removed: orEmpty(r.Removed)}
		if len(out.Removed) == 0 {
			return out, "nothing to remove", nil
		}
		return out, "removed " + strings.Join(out.Removed, ", "), nil
	})
}

// ListInput is the input of sandbox_list. Every field filters; none lists
// everything agents-sandbox made on the engine.
type ListInput struct {
	// Checkout limits the list to that project's sandboxes.
	Checkout string `json:"checkout,omitempty"`
	Agent    string `json:"agent,omitempty"`
	Kind     string `json:"kind,omitempty"`  // vm or task
	State    string `json:"state,omitempty"` // running or stopped
}

// ListItem is one VM or task sandbox.
type ListItem struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	State    string   `json:"state"`
	Image    string   `json:"image"`
	Created  string   `json:"created,omitempty"`
	LastUsed string   `json:"last_used,omitempty"`
	Checkout string   `json:"checkout"`
	Project  string   `json:"project"`
	Agent    string   `json:"agent"`
	Dir      string   `json:"dir,omitempty"`
	Labels   []string `json:"labels"`
}

// ListOutput is the result of sandbox_list, newest first.
type ListOutput struct {
	Items []ListItem `json:"items"`
}

func (h *handlers) listTool() Tool {
	return define(Tool{
		Name:  "sandbox_list",
		Title: "List sandboxes",
		Description: "List the sandbox VMs and task sandboxes agents-sandbox made (found by label), newest first, with state, image, " +
			"checkout and agent. Give checkout to list one project's, and agent, kind (vm, task) or state (running, stopped) to filter.",
		InputSchema: "sandbox_list.input.json", OutputSchema: "sandbox_list.output.json",
		Hints: Hints{ReadOnly: Yes, Destructive: No, Idempotent: Yes, OpenWorld: No},
	}, func(ctx context.Context, c Call, in *ListInput) (ListOutput, string, error) {
		f := sandbox.ListFilter{Agent: in.Agent, Kind: sandbox.Kind(in.Kind), State: sandbox.VMState(in.State)}
		if in.Checkout != "" {
			p, err := h.inspect(ctx, "sandbox_list", InspectTarget{Checkout: in.Checkout, Agent: in.Agent})
			if err != nil {
				return ListOutput{}, "", err
			}
			f.Checkout = p.ID.CheckoutSlug
		}
		ls, err := h.Core.List(ctx, f)
		if err != nil {
			return ListOutput{}, "", err
		}
		out := ListOutput{Items: []ListItem{}}
		var lines []string
		for _, l := range ls {
			out.Items = append(out.Items, ListItem{Name: l.Name, Kind: string(l.Kind), State: string(l.State), Image: l.Image,
				Created: ts(l.Created), LastUsed: ts(l.LastUsed), Checkout: l.Checkout, Project: l.Project, Agent: l.Agent,
				Dir: l.Dir, Labels: sortedLabels(l.Labels)})
			lines = append(lines, fmt.Sprintf("%s\t%s\t%s", l.Name, l.Kind, l.State))
		}
		text := plural(len(out.Items), "sandbox", "sandboxes")
		if len(lines) > 0 {
			text += ":\n" + strings.Join(lines, "\n")
		}
		return out, text, nil
	})
}
