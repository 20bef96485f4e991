package sandbox_test

// End-to-end tests of listing, stopping, killing and removing against the
// real engine, through Manager and the CLI.

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// tkAltAgent is a second agent like shell, defined in the project config.
const tkAltAgent = "[agents.tkalt]\nattach = [\"bash\", \"-l\"]\nheadless = [\"bash\", \"-lc\"]\n"

func tkNames(items []sandbox.Listed) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.Name)
	}
	sort.Strings(out)
	return out
}

func tkSorted(s ...string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

func TestList(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dirA := e.checkout(t, "lista", nil)
	tkWrite(t, filepath.Join(dirA, ".agents-sandbox", "config.toml"), tkConfig+tkAltAgent, 0o644)
	dirB := e.checkout(t, "listb", nil)
	dirC := e.checkout(t, "listc", nil)
	pa, alt, pb := e.open(t, dirA, ""), e.open(t, dirA, "tkalt"), e.open(t, dirB, "")
	ctx := tkCtx(t)

	e.create(t, pa)
	keep := sandbox.TaskOptions{Cmd: []string{"true"}, Keep: true, Workspace: sandbox.WorkspaceNone}
	ta, talt, tb := e.spawn(t, pa, keep), e.spawn(t, alt, keep), e.spawn(t, pb, keep)
	vm := pa.Names.VM
	slugA := pa.ID.CheckoutSlug

	tests := []struct {
		name string
		f    sandbox.ListFilter
		want []string
	}{
		{"checkout", sandbox.ListFilter{Checkout: slugA}, tkSorted(vm, ta.Name, talt.Name)},
		{"tasks", sandbox.ListFilter{Checkout: slugA, Kind: sandbox.KindTask}, tkSorted(ta.Name, talt.Name)},
		{"vms", sandbox.ListFilter{Checkout: slugA, Kind: sandbox.KindVM}, []string{vm}},
		{"running", sandbox.ListFilter{Checkout: slugA, State: sandbox.VMRunning}, []string{vm}},
		{"stopped", sandbox.ListFilter{Checkout: slugA, State: sandbox.VMStopped}, tkSorted(ta.Name, talt.Name)},
		{"agent", sandbox.ListFilter{Checkout: slugA, Agent: "tkalt"}, []string{talt.Name}},
		{"agent and kind", sandbox.ListFilter{Checkout: slugA, Agent: "shell", Kind: sandbox.KindTask}, []string{ta.Name}},
		{"other checkout", sandbox.ListFilter{Checkout: pb.ID.CheckoutSlug}, []string{tb.Name}},
		{"empty checkout", sandbox.ListFilter{Checkout: e.open(t, dirC, "").ID.CheckoutSlug}, []string{}},
	}
	for _, tt := range tests {
		items, err := e.m.List(ctx, tt.f)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := tkNames(items); !slices.Equal(got, tt.want) {
			t.Errorf("%s: List(%+v) = %q, want %q", tt.name, tt.f, got, tt.want)
		}
	}

	// Every checkout: ours are among them (other tests share the engine).
	all, err := e.m.List(ctx, sandbox.ListFilter{Kind: sandbox.KindTask, State: sandbox.VMStopped})
	if err != nil {
		t.Fatal(err)
	}
	got := tkNames(all)
	for _, n := range []string{ta.Name, talt.Name, tb.Name} {
		if !slices.Contains(got, n) {
			t.Errorf("every checkout's stopped tasks lack %s", n)
		}
	}
	if slices.Contains(got, vm) {
		t.Errorf("every checkout's stopped tasks hold the running VM %s", vm)
	}

	// What an item says, newest first.
	items, err := e.m.List(ctx, sandbox.ListFilter{Checkout: slugA})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, it := range items {
		if i > 0 && it.Created.After(items[i-1].Created) {
			t.Errorf("item %d (%s) is newer than item %d", i, it.Name, i-1)
		}
		wantKind, wantState, wantImage, wantAgent := sandbox.KindTask, sandbox.VMStopped, pa.Names.RunnerImage, "shell"
		switch it.Name {
		case vm:
			wantKind, wantState = sandbox.KindVM, sandbox.VMRunning
		case talt.Name:
			wantImage, wantAgent = alt.Names.RunnerImage, "tkalt"
		}
		if it.Kind != wantKind || it.State != wantState || it.Image != wantImage || it.Agent != wantAgent ||
			it.Checkout != slugA || it.Project != pa.ID.RepoSlug || it.Dir != pa.ID.ProjectDir || it.Labels[sandbox.LabelKind] != string(wantKind) {
			t.Errorf("item %s: %+v; want kind %s, state %s, image %s, agent %s, checkout %s", it.Name, it, wantKind, wantState, wantImage, wantAgent, slugA)
		}
		if it.Created.IsZero() || it.Created.After(now) || it.LastUsed.Before(it.Created) || it.LastUsed.After(now.Add(time.Minute)) {
			t.Errorf("item %s: created %s, last used %s", it.Name, it.Created, it.LastUsed)
		}
	}

	// The CLI: JSON shape, --all, filters, and refused combinations.
	type item struct {
		Name, Kind, State, Image, Checkout, Agent string
		Created                                   time.Time
		LastUsed                                  time.Time `json:"last_used"`
		Labels                                    map[string]string
	}
	listJSON := func(dir string, args ...string) []item {
		t.Helper()
		out, stderr, code := e.cli(t, dir, append([]string{"ls", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("ls --json %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw) != 1 || raw["items"] == nil {
			t.Fatalf("ls --json: %v; want an object with only \"items\":\n%s", err, out)
		}
		var doc struct{ Items []item }
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		var fields []map[string]any
		_ = json.Unmarshal(raw["items"], &fields)
		for _, f := range fields {
			for _, k := range []string{"name", "kind", "state", "image", "created", "last_used", "checkout", "agent", "labels"} {
				if _, ok := f[k]; !ok {
					t.Errorf("ls --json item lacks %q: %v", k, f)
				}
			}
		}
		return doc.Items
	}
	itemNames := func(items []item) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.Name)
		}
		sort.Strings(out)
		return out
	}
	if got := itemNames(listJSON(dirA)); !slices.Equal(got, tkSorted(vm, ta.Name, talt.Name)) {
		t.Errorf("ls --json in checkout A: %q", got)
	}
	if got := listJSON(dirA, "--kind", "vm", "--running"); len(got) != 1 || got[0].Name != vm || got[0].Image != pa.Names.RunnerImage || got[0].Created.IsZero() || got[0].LastUsed.IsZero() {
		t.Errorf("ls --json --kind vm --running: %+v", got)
	}
	if got := itemNames(listJSON(dirA, "--agent", "tkalt")); !slices.Equal(got, []string{talt.Name}) {
		t.Errorf("ls --json --agent tkalt: %q", got)
	}
	allTasks := itemNames(listJSON(dirA, "--all", "--kind", "task", "--stopped"))
	for _, n := range []string{ta.Name, talt.Name, tb.Name} {
		if !slices.Contains(allTasks, n) {
			t.Errorf("ls --all --kind task --stopped lacks %s: %q", n, allTasks)
		}
	}
	if out, stderr, code := e.cli(t, dirC, "ls", "--json"); code != 0 || strings.Join(strings.Fields(out), "") != `{"items":[]}` {
		t.Errorf("ls --json with nothing: exit %d, %q, %s", code, out, stderr)
	}
	out, _, code := e.cli(t, dirA, "ls", "--stopped")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") ||
		!strings.Contains(out, ta.Name) || !strings.Contains(out, talt.Name) || strings.Contains(out, vm+" ") {
		t.Errorf("ls --stopped: exit %d:\n%s", code, out)
	}
	for _, args := range [][]string{{"--running", "--stopped"}, {"--kind", "home"}} {
		if _, stderr, code := e.cli(t, dirA, append([]string{"ls"}, args...)...); code != 2 || !strings.Contains(stderr, "agents-sandbox: ") {
			t.Errorf("ls %s: exit %d, %q; want 2 and an error", strings.Join(args, " "), code, stderr)
		}
	}
}

func TestStopKillRemove(t *testing.T) {
	t.Parallel()
	e := newTK(t)
	dir := e.checkout(t, "stopkill", nil)
	p := e.open(t, dir, "")
	ctx := tkCtx(t)
	cr := e.create(t, p)
	vm := p.Names.VM
	state := func() sandbox.VMState {
		t.Helper()
		s, err := e.m.Status(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return s.State
	}
	exists := func(kind, name string) bool {
		t.Helper()
		var err error
		if kind == "vm" {
			_, err = e.rt.InspectVM(ctx, name)
		} else {
			_, err = e.rt.InspectVolume(ctx, name)
		}
		if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	if out, stderr, code := e.cli(t, dir, "stop", "--timeout", "2s"); code != 0 || out != vm+": stopped\n" {
		t.Errorf("stop: exit %d, %q, %s", code, out, stderr)
	}
	if s := state(); s != sandbox.VMStopped {
		t.Errorf("after stop: %s", s)
	}
	if again := e.create(t, p); again.Action != sandbox.VMStarted || again.HomeVolume != cr.HomeVolume {
		t.Errorf("Create after stop: %s with %s; want started with %s", again.Action, again.HomeVolume, cr.HomeVolume)
	}
	s, err := e.m.Kill(ctx, p)
	if err != nil || s.State != sandbox.VMStopped {
		t.Errorf("Kill: %s, %v; want stopped", s.State, err)
	}
	if s, err := e.m.Kill(ctx, p); err != nil || s.State != sandbox.VMStopped {
		t.Errorf("Kill of a stopped VM: %s, %v; want stopped and no error", s.State, err)
	}
	if out, stderr, code := e.cli(t, dir, "kill"); code != 0 || out != vm+": stopped\n" {
		t.Errorf("kill of a stopped VM: exit %d, %q, %s", code, out, stderr)
	}

	// --volume with no terminal to ask on and no --yes: refused, nothing
	// removed.
	out, stderr, code := e.cli(t, dir, "rm", "--volume")
	if code != 2 || !strings.Contains(stderr, "--yes") || !strings.Contains(stderr, "no terminal") || out != "" {
		t.Errorf("rm --volume without a terminal: exit %d, stdout %q, stderr %q; want 2 and an error naming --yes", code, out, stderr)
	}
	if !exists("vm", vm) || !exists("volume", cr.HomeVolume) {
		t.Fatalf("the refused rm --volume removed something: vm %v, volume %v", exists("vm", vm), exists("volume", cr.HomeVolume))
	}

	// rm without --volume keeps the home volume, and the next Create uses it.
	if out, stderr, code := e.cli(t, dir, "rm"); code != 0 || out != "removed vm "+vm+"\n" {
		t.Errorf("rm: exit %d, %q, %s", code, out, stderr)
	}
	if exists("vm", vm) || !exists("volume", cr.HomeVolume) {
		t.Errorf("after rm: vm exists %v, volume exists %v; want false, true", exists("vm", vm), exists("volume", cr.HomeVolume))
	}
	if again := e.create(t, p); again.Action != sandbox.VMCreatedA || again.VolumeCreated || again.HomeVolume != cr.HomeVolume {
		t.Errorf("Create after rm: %s, volume %s (created %v); want created with the old volume", again.Action, again.HomeVolume, again.VolumeCreated)
	}

	// --volume --yes removes both, and the state forgets the volume.
	out, stderr, code = e.cli(t, dir, "rm", "--volume", "--yes")
	if code != 0 || !strings.Contains(out, "removed vm "+vm+"\n") || !strings.Contains(out, "removed volume "+cr.HomeVolume+"\n") {
		t.Errorf("rm --volume --yes: exit %d, %q, %s", code, out, stderr)
	}
	if exists("vm", vm) || exists("volume", cr.HomeVolume) {
		t.Errorf("after rm --volume --yes: vm exists %v, volume exists %v", exists("vm", vm), exists("volume", cr.HomeVolume))
	}
	st, err := sandbox.LoadState(p.Names.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if as := st.Agents[p.Names.Agent]; as != nil && as.HomeVolume != "" {
		t.Errorf("state still records the home volume %s", as.HomeVolume)
	}
	if out, _, code := e.cli(t, dir, "rm"); code != 0 || out != "nothing to remove\n" {
		t.Errorf("rm with nothing left: exit %d, %q", code, out)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the checkout: %v", err)
	}
}
