package sandbox

// Migration from the origin-keyed layout (DESIGN.md "Migration from the
// origin-keyed layout").
//
// Before checkouts had their own identity, everything of a project was keyed
// by the slug of its origin remote (the repo slug). That layout, as data:
//
//	state dir     <state>/<repo-slug>/                       (state.json and whatever else)
//	VM            agents-sandbox-<repo-slug>-<agent>
//	home volume   agents-sandbox-<repo-slug>-<agent>-<UTC timestamp>
//	runner image  agents-sandbox/agents-sandbox-runner-<repo-slug>:<agent>-latest
//	labels        org.agents-sandbox.project=<repo-slug>, org.agents-sandbox.agent=<agent>,
//	              org.agents-sandbox.kind=vm|home|runner — and no org.agents-sandbox.checkout,
//	              a notion the layout did not have.
//
// The migration only needs the state dir and the VM: the VM's home volume is
// read from its mounts (or from the legacy state), never guessed from a name.
// The legacy runner image is left alone; it carries kind=runner, so `prune`
// removes it once no VM uses it (see LegacyArtifacts).
//
// A checkout without an origin remote has repo slug == checkout slug: its
// "legacy" state dir is its own and the legacy VM name is the
// legacy-prefixed name that findVM reuses, so there is nothing to migrate.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// OriginLayout names the artifacts of the origin-keyed layout of one repo
// slug. Build it with OriginLayoutFor.
type OriginLayout struct {
	// RepoSlug keys every artifact of the layout.
	RepoSlug string `json:"repo_slug"`
	// StateDir is <state>/<repo-slug>.
	StateDir string `json:"state_dir"`
	// LockPath is the migration lock, <state>/.migrate-<repo-slug>.lock: a
	// sibling of StateDir (so that removing StateDir never races with it),
	// shared by every checkout of the remote. The leading dot keeps it
	// apart from state dirs, whose slugs start with [a-z0-9].
	LockPath string `json:"lock_path"`
}

// OriginLayoutFor returns the origin-keyed layout that id's artifacts had,
// and false when there is none to migrate (no origin remote: the repo slug
// is the checkout slug).
func OriginLayoutFor(id Identity, dirs Dirs) (OriginLayout, bool) {
	if id.RepoSlug == "" || id.RepoSlug == id.CheckoutSlug {
		return OriginLayout{}, false
	}
	return OriginLayout{
		RepoSlug: id.RepoSlug,
		StateDir: filepath.Join(dirs.State, id.RepoSlug),
		LockPath: filepath.Join(dirs.State, ".migrate-"+id.RepoSlug+".lock"),
	}, true
}

// VM is the name of the layout's VM for agent: agents-sandbox-<repo-slug>-<agent>.
func (l OriginLayout) VM(agent string) string {
	return LegacyPrefix + l.RepoSlug + "-" + SanitizeName(agent)
}

// HomeVolumePrefix is the prefix of the layout's home volume names for
// agent: agents-sandbox-<repo-slug>-<agent>- (a UTC timestamp followed).
func (l OriginLayout) HomeVolumePrefix(agent string) string {
	return l.VM(agent) + "-"
}

// RunnerImage is the layout's runner image for agent:
// agents-sandbox/agents-sandbox-runner-<repo-slug>:<agent>-latest.
func (l OriginLayout) RunnerImage(agent string) string {
	return "agents-sandbox/" + LegacyPrefix + "runner-" + l.RepoSlug + ":" + SanitizeName(agent) + "-latest"
}

// Labels are the labels the layout put on an artifact of kind k: project,
// agent and kind, no checkout.
func (l OriginLayout) Labels(agent string, k Kind) map[string]string {
	return map[string]string{LabelProject: l.RepoSlug, LabelAgent: SanitizeName(agent), LabelKind: string(k)}
}

// MigrationStep names one step of the migration, in the order they run.
type MigrationStep string

// Migration steps.
const (
	// StepRecordVolume: the home volume the legacy VM mounts was written
	// into the checkout's state (which had none for that agent).
	StepRecordVolume MigrationStep = "record-volume"
	// StepDestroyVM: the legacy VM was stopped and removed (its named home
	// volume stays).
	StepDestroyVM MigrationStep = "destroy-vm"
	// StepMergeState: what the checkout's state.json lacked was taken from
	// the legacy state.json, and the legacy state.json removed.
	StepMergeState MigrationStep = "merge-state"
	// StepMove: a legacy file or directory was moved into the checkout's
	// state dir.
	StepMove MigrationStep = "move"
	// StepDrop: a legacy file was removed because the checkout's state dir
	// already holds the same content (or, for an empty *.lock file, any
	// lock file of that name).
	StepDrop MigrationStep = "drop"
	// StepRemoveDir: the emptied legacy state dir was removed.
	StepRemoveDir MigrationStep = "remove-dir"
)

// MigrationAction is one thing the migration did, or in a dry run would do.
type MigrationAction struct {
	Step  MigrationStep `json:"step"`
	Agent string        `json:"agent,omitempty"`
	// Target is what the step acted on: a VM or volume name, or a path
	// relative to the legacy state dir (directories end in "/").
	Target string `json:"target"`
	Detail string `json:"detail,omitempty"`
}

// MigrationConflict is a legacy file or directory that could not move. It
// stays where it is.
type MigrationConflict struct {
	Path   string `json:"path"`   // absolute path in the legacy state dir
	Target string `json:"target"` // where it would have gone
	Reason string `json:"reason"`
}

// MigrationReport says what Migrate found and did (or, in a dry run, would
// do).
type MigrationReport struct {
	DryRun bool `json:"dry_run"`
	// Found is true when an origin-keyed layout of this checkout was found
	// (and, without DryRun, when this call migrated it).
	Found bool `json:"found"`
	// RepoSlug, LegacyStateDir and StateDir are empty when the checkout has
	// no origin-keyed layout at all (no origin remote).
	RepoSlug       string `json:"repo_slug,omitempty"`
	LegacyStateDir string `json:"legacy_state_dir,omitempty"`
	// StateDir is the checkout's state dir, the migration's destination.
	StateDir string `json:"state_dir"`
	// Actions are the steps taken (or that would be taken), in order.
	Actions []MigrationAction `json:"actions"`
	// Kept lists what could not move; it stays in LegacyStateDir.
	Kept []MigrationConflict `json:"kept"`
	// Complete is true when nothing of the legacy layout is left (or, in a
	// dry run, would be left): no legacy VM, no legacy state dir.
	Complete bool `json:"complete"`
	// Warnings are the lines to show the user: on stderr (CLI) or in the
	// tool result's text. Empty when nothing was found.
	Warnings []string `json:"warnings,omitempty"`
}

// MigrateOptions tune Migrate.
type MigrateOptions struct {
	// DryRun reports what the migration would do and changes nothing: no
	// VM, volume, state or file is touched and no lock file is created.
	DryRun bool
	// OnStep, when set, is called after each action has been carried out
	// and made durable (not in a dry run). It runs with the migration's
	// locks held and must not block for long.
	OnStep func(MigrationAction)
}

// legacyStopTimeout is how long the legacy VM gets to stop before SIGKILL.
const legacyStopTimeout = 10 * time.Second

// Migrate detects the origin-keyed layout of p's checkout and migrates it
// (see MigrateCheckout); afterwards the secrets the merged state carries
// are applied to p, as Open would have.
//
// Call it right after Open and before anything that takes the checkout's
// locks: it takes the checkout's per-agent VM locks itself.
func (m *Manager) Migrate(ctx context.Context, p *Project, o MigrateOptions) (MigrationReport, error) {
	rep, st, err := m.migrate(ctx, p.ID, p.Names.Agent, o)
	if err == nil && !o.DryRun && st != nil {
		applyStateSecrets(p, st)
	}
	return rep, err
}

// MigrateCheckout migrates the origin-keyed layout of the checkout id into
// the checkout's own layout, for agent and for every agent the legacy state
// knows. The steps, each idempotent, so that a run interrupted anywhere is
// finished by the next and the home volume is never lost:
//
//  1. record the home volume each legacy VM mounts in the checkout's state,
//     where the checkout's state has none for that agent;
//  2. destroy the legacy VMs (stop, then remove; named volumes stay);
//  3. merge the legacy state dir into the checkout's, recursively, never
//     overwriting an existing file: state.json field by field (the
//     checkout's values win, the legacy fills what is missing), other files
//     by moving them; an identical file, or an empty *.lock file, whose name
//     is taken is dropped; anything else whose name is taken, or that cannot
//     be moved, is reported in Kept and stays;
//  4. remove the legacy state dir when it is empty.
//
// When there is nothing to migrate it costs one stat of the legacy state dir
// and at most one inspect of the legacy VM of agent (nothing at all for a
// checkout without an origin remote). Otherwise it runs under a lock file
// beside the legacy state dir that every checkout of the remote shares:
// when two clones race, the first migrates the shared layout and the second
// finds nothing left. It then also takes the checkout's per-agent VM locks
// (never call it holding one). A legacy VM that does not carry
// org.agents-sandbox.project=<repo slug> is not ours and is left alone.
//
// With o.DryRun nothing is changed and no lock is taken.
// Errors: the engine fails, ctx ends, or the checkout's state cannot be read
// or written; per-file failures are not errors but Kept entries.
func (m *Manager) MigrateCheckout(ctx context.Context, id Identity, agent string, o MigrateOptions) (MigrationReport, error) {
	rep, _, err := m.migrate(ctx, id, agent, o)
	return rep, err
}

// migrate is MigrateCheckout; it also returns the checkout's state as it is
// after the migration (in a dry run: as it would be).
func (m *Manager) migrate(ctx context.Context, id Identity, agent string, o MigrateOptions) (MigrationReport, *State, error) {
	agent = SanitizeName(agent)
	stateDir := id.Names(agent, m.Dirs).StateDir
	rep := MigrationReport{DryRun: o.DryRun, StateDir: stateDir, Actions: []MigrationAction{}, Kept: []MigrationConflict{}, Complete: true}
	l, ok := OriginLayoutFor(id, m.Dirs)
	if !ok {
		return rep, nil, nil
	}
	rep.RepoSlug, rep.LegacyStateDir = l.RepoSlug, l.StateDir
	found, err := m.detectLegacy(ctx, l, agent)
	if err != nil || !found {
		return rep, nil, err
	}
	if !o.DryRun {
		lock, err := AcquireLock(ctx, l.LockPath)
		if err != nil {
			return rep, nil, fmt.Errorf("migrate %s: %w", l.StateDir, err)
		}
		defer lock.Unlock()
		// Another process (another clone of the remote, say) may have
		// migrated it while we waited.
		if found, err = m.detectLegacy(ctx, l, agent); err != nil || !found {
			return rep, nil, err
		}
	}
	mg := &migration{m: m, l: l, dir: stateDir, dry: o.DryRun, onStep: o.OnStep, rep: &rep}
	st, err := mg.run(ctx, agent)
	rep.Warnings = mg.warnings()
	return rep, st, err
}

// detectLegacy reports whether anything of the layout is left: its state
// dir, or the legacy VM of agent (when it is ours).
func (m *Manager) detectLegacy(ctx context.Context, l OriginLayout, agent string) (bool, error) {
	fi, err := os.Lstat(l.StateDir)
	switch {
	case err == nil && fi.IsDir():
		return true, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("migrate: stat legacy state dir: %w", err)
	}
	vm, err := m.RT.InspectVM(ctx, l.VM(agent))
	switch {
	case isNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("migrate: inspect legacy VM %q: %w", l.VM(agent), err)
	}
	return vm.Labels[LabelProject] == l.RepoSlug, nil
}

// migration is one run of the migration.
type migration struct {
	m      *Manager
	l      OriginLayout
	dir    string // the checkout's state dir
	dry    bool
	onStep func(MigrationAction)
	rep    *MigrationReport
	notes  []string // extra warnings
	st     *State   // the checkout's state, as migrated so far
	// locks are the lock files a real run creates in the checkout's state
	// dir before merging (a dry run predicts their effect).
	locks map[string]bool
}

func (mg *migration) did(a MigrationAction) {
	mg.rep.Actions = append(mg.rep.Actions, a)
	if !mg.dry && mg.onStep != nil {
		mg.onStep(a)
	}
}

func (mg *migration) keep(src, dst string, reason string) {
	mg.rep.Kept = append(mg.rep.Kept, MigrationConflict{Path: src, Target: dst, Reason: reason})
}

// saveState writes the checkout's state (not in a dry run).
func (mg *migration) saveState() error {
	if mg.dry {
		return nil
	}
	return SaveState(mg.dir, mg.st)
}

func (mg *migration) run(ctx context.Context, agent string) (*State, error) {
	rep, m, l := mg.rep, mg.m, mg.l
	rep.Found = true

	// The legacy state names the agents it had; each may have a VM.
	var legacy *State
	var legacyErr error
	legacyFile := StateFile(l.StateDir)
	legacyDirExists := false
	if fi, err := os.Lstat(l.StateDir); err == nil && fi.IsDir() {
		legacyDirExists = true
		if _, err := os.Lstat(legacyFile); err == nil {
			legacy, legacyErr = LoadState(l.StateDir)
		} else if !errors.Is(err, fs.ErrNotExist) {
			legacyErr = err
		}
	}
	agents := map[string]bool{agent: true}
	if legacy != nil {
		for a := range legacy.Agents {
			if s := SanitizeName(a); ValidDockerName(l.VM(s)) {
				agents[s] = true
			}
		}
	}
	names := make([]string, 0, len(agents))
	for a := range agents {
		names = append(names, a)
	}
	sort.Strings(names)
	// The checkout's state is read, changed and written under its VM locks,
	// as Create does; in sorted order, so two migrations cannot deadlock.
	// SaveState holds the state lock while it writes.
	mg.locks = map[string]bool{filepath.Base(LockFile(mg.dir, "state")): true}
	for _, a := range names {
		path := LockFile(mg.dir, "vm-"+a)
		mg.locks[filepath.Base(path)] = true
		if mg.dry {
			continue
		}
		lk, err := AcquireLock(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		defer lk.Unlock()
	}
	st, err := LoadState(mg.dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	mg.st = st

	// 1. Record each legacy VM's home volume.
	type legacyVM struct {
		agent string
		vm    VM
	}
	var vms []legacyVM
	for _, a := range names {
		name := l.VM(a)
		vm, err := m.RT.InspectVM(ctx, name)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: inspect legacy VM %q: %w", name, err)
		}
		if vm.Labels[LabelProject] != l.RepoSlug {
			mg.notes = append(mg.notes, fmt.Sprintf("a container named %s exists but does not carry %s=%s: it is not an agents-sandbox VM of this remote and is left alone", name, LabelProject, l.RepoSlug))
			continue
		}
		vms = append(vms, legacyVM{a, vm})
	}
	for _, v := range vms {
		vol := homeVolumeOf(v.vm)
		as := mg.st.Agent(v.agent)
		switch {
		case vol == "":
			mg.notes = append(mg.notes, fmt.Sprintf("legacy VM %s mounts no home volume at %s: nothing to keep", v.vm.Name, HomeDir))
		case as.HomeVolume == "":
			as.HomeVolume = vol
			if err := mg.saveState(); err != nil {
				return nil, fmt.Errorf("migrate: record home volume %q: %w", vol, err)
			}
			mg.did(MigrationAction{Step: StepRecordVolume, Agent: v.agent, Target: vol, Detail: "mounted by legacy VM " + v.vm.Name})
		case as.HomeVolume != vol:
			mg.notes = append(mg.notes, fmt.Sprintf("legacy VM %s mounts home volume %s, but this checkout already uses %s: %s is kept on the engine, unused (remove it yourself once you no longer need it)", v.vm.Name, vol, as.HomeVolume, vol))
		}
	}

	// 2. Destroy the legacy VMs.
	for _, v := range vms {
		if !mg.dry {
			if v.vm.State == VMRunning || v.vm.State == VMPaused {
				if err := m.RT.StopVM(ctx, v.vm.Name, legacyStopTimeout); err != nil && !isNotFound(err) && !errors.Is(err, ErrConflict) {
					return nil, fmt.Errorf("migrate: stop legacy VM %q: %w", v.vm.Name, err)
				}
			}
			if err := m.RT.RemoveVM(ctx, v.vm.Name, true); err != nil && !isNotFound(err) {
				return nil, fmt.Errorf("migrate: remove legacy VM %q: %w", v.vm.Name, err)
			}
		}
		mg.did(MigrationAction{Step: StepDestroyVM, Agent: v.agent, Target: v.vm.Name})
	}

	if !legacyDirExists {
		return mg.st, nil
	}

	// 3. Merge the legacy state dir: state.json first, then the rest.
	if !mg.dry {
		if err := os.MkdirAll(mg.dir, 0o700); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	allGone := true
	switch {
	case legacyErr != nil:
		mg.keep(legacyFile, StateFile(mg.dir), fmt.Sprintf("cannot read it to merge it into the checkout's state: %v", legacyErr))
		allGone = false
	case legacy != nil:
		taken := mergeLegacyState(mg.st, legacy, &mg.notes)
		if len(taken) > 0 {
			if err := mg.saveState(); err != nil {
				return nil, fmt.Errorf("migrate: merge legacy state: %w", err)
			}
		}
		if !mg.dry {
			if err := os.Remove(legacyFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
				mg.keep(legacyFile, StateFile(mg.dir), fmt.Sprintf("merged, but cannot remove it: %v", err))
				allGone = false
			}
		}
		detail := "nothing missing from the checkout's state"
		if len(taken) > 0 {
			detail = "took " + strings.Join(taken, ", ")
		}
		mg.did(MigrationAction{Step: StepMergeState, Target: "state.json", Detail: detail})
	}
	if !mg.mergeTree(ctx, l.StateDir, mg.dir, "") {
		allGone = false
	}

	// 4. Remove the legacy state dir once it is empty.
	if mg.dry {
		if allGone {
			mg.did(MigrationAction{Step: StepRemoveDir, Target: l.StateDir})
		} else {
			rep.Complete = false
		}
		return mg.st, nil
	}
	if err := os.Remove(l.StateDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		rep.Complete = false
		if len(rep.Kept) == 0 {
			// Something appeared in it meanwhile; the next run moves it.
			mg.keep(l.StateDir, mg.dir, fmt.Sprintf("cannot remove the legacy state dir: %v", err))
		}
		return mg.st, nil
	}
	mg.did(MigrationAction{Step: StepRemoveDir, Target: l.StateDir})
	return mg.st, nil
}

// mergeTree moves the entries of src (the legacy dir at rel) into dst,
// never replacing anything in dst, and reports whether everything left src
// (in a dry run: would leave it). The legacy state.json is skipped: run
// merges it.
func (mg *migration) mergeTree(ctx context.Context, src, dst, rel string) bool {
	entries, err := os.ReadDir(src)
	if err != nil {
		mg.keep(src, dst, fmt.Sprintf("cannot list it: %v", err))
		return false
	}
	allGone := true
	for _, e := range entries {
		if ctx.Err() != nil {
			mg.keep(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), ctx.Err().Error())
			allGone = false
			continue
		}
		name := e.Name()
		if rel == "" && name == "state.json" {
			continue
		}
		s, d, r := filepath.Join(src, name), filepath.Join(dst, name), path.Join(rel, name)
		sfi, err := os.Lstat(s)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			mg.keep(s, d, err.Error())
			allGone = false
			continue
		}
		shown := r
		if sfi.IsDir() {
			shown += "/"
		}
		dfi, err := os.Lstat(d)
		if errors.Is(err, fs.ErrNotExist) && mg.dry && rel == "" && mg.locks[name] && sfi.Mode().IsRegular() {
			// A real run holds this lock file by now: predict what it does.
			if sfi.Size() == 0 {
				mg.did(MigrationAction{Step: StepDrop, Target: shown, Detail: lockDropReason})
				continue
			}
			mg.keep(s, d, takenReason(d))
			allGone = false
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			if !mg.dry {
				err = moveNoReplace(s, d, sfi.IsDir())
				if errors.Is(err, fs.ErrExist) {
					// Taken meanwhile: treat it as taken below.
					dfi, err = os.Lstat(d)
					if err == nil {
						if !mg.mergeExisting(ctx, s, d, r, shown, sfi, dfi) {
							allGone = false
						}
						continue
					}
				}
				if err != nil {
					mg.keep(s, d, err.Error())
					allGone = false
					continue
				}
			}
			mg.did(MigrationAction{Step: StepMove, Target: shown})
			continue
		}
		if err != nil {
			mg.keep(s, d, err.Error())
			allGone = false
			continue
		}
		if !mg.mergeExisting(ctx, s, d, r, shown, sfi, dfi) {
			allGone = false
		}
	}
	return allGone
}

// mergeExisting handles a legacy entry s whose name d is taken in the
// checkout's state dir, and reports whether s is (or would be) gone.
func (mg *migration) mergeExisting(ctx context.Context, s, d, rel, shown string, sfi, dfi fs.FileInfo) bool {
	switch {
	case sfi.IsDir() && dfi.IsDir():
		gone := mg.mergeTree(ctx, s, d, rel)
		if gone && !mg.dry {
			if err := os.Remove(s); err != nil && !errors.Is(err, fs.ErrNotExist) {
				mg.keep(s, d, fmt.Sprintf("emptied, but cannot remove it: %v", err))
				return false
			}
		}
		return gone
	case sfi.Mode().IsRegular() && dfi.Mode().IsRegular():
		why := ""
		if strings.HasSuffix(sfi.Name(), ".lock") && sfi.Size() == 0 {
			why = lockDropReason
		} else if same, _ := sameContent(s, d, sfi, dfi); same {
			why = "the checkout's state dir holds the same content"
		}
		if why == "" {
			break
		}
		if !mg.dry {
			if err := os.Remove(s); err != nil && !errors.Is(err, fs.ErrNotExist) {
				mg.keep(s, d, fmt.Sprintf("%s, but cannot remove it: %v", why, err))
				return false
			}
		}
		mg.did(MigrationAction{Step: StepDrop, Target: shown, Detail: why})
		return true
	}
	mg.keep(s, d, takenReason(d))
	return false
}

const lockDropReason = "an empty lock file; the checkout has its own"

func takenReason(d string) string {
	return "the checkout's state dir already has " + d + ", which is kept"
}

// moveNoReplace moves s to d without ever replacing something at d: a file
// (or symlink, or other non-directory) is hard-linked to d, which fails when
// d exists, then unlinked from s; a directory is renamed, which replaces
// only an empty directory. A crash between link and unlink leaves the same
// file under both names, which the next run drops as identical.
// Errors wrap fs.ErrExist when d is taken.
func moveNoReplace(s, d string, dir bool) error {
	if dir {
		if _, err := os.Lstat(d); err == nil {
			return fmt.Errorf("move %s: %w", s, fs.ErrExist)
		}
		if err := os.Rename(s, d); err != nil {
			if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("move %s: %w", s, fs.ErrExist)
			}
			return fmt.Errorf("move %s: %w", s, err)
		}
		return nil
	}
	err := os.Link(s, d)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("move %s: %w", s, fs.ErrExist)
	case errors.Is(err, syscall.EXDEV):
		return fmt.Errorf("move %s: %w (the legacy state dir is on another filesystem; move it by hand)", s, err)
	default:
		// A filesystem without hard links: rename when d is still free.
		if _, lerr := os.Lstat(d); lerr == nil {
			return fmt.Errorf("move %s: %w", s, fs.ErrExist)
		}
		if rerr := os.Rename(s, d); rerr != nil {
			return fmt.Errorf("move %s: %w", s, rerr)
		}
		return nil
	}
	if err := os.Remove(s); err != nil {
		// d is a second name for the same file: drop it again, so the
		// legacy copy is the one reported and nothing is lost.
		_ = os.Remove(d)
		return fmt.Errorf("move %s: %w", s, err)
	}
	return nil
}

// sameContent reports whether two regular files hold the same bytes.
func sameContent(a, b string, afi, bfi fs.FileInfo) (bool, error) {
	if os.SameFile(afi, bfi) {
		return true, nil
	}
	if afi.Size() != bfi.Size() {
		return false, nil
	}
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 32<<10), make([]byte, 32<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			done := func(e error) bool { return errors.Is(e, io.EOF) || errors.Is(e, io.ErrUnexpectedEOF) }
			if done(ea) && done(eb) {
				return true, nil
			}
			if !done(ea) {
				return false, ea
			}
			return false, eb
		}
	}
}

// homeVolumeOf is the named volume a VM mounts at HomeDir, or "".
func homeVolumeOf(vm VM) string {
	for _, mt := range vm.Mounts {
		if mt.Type == "volume" && mt.Target == HomeDir {
			return mt.Source
		}
	}
	return ""
}

// mergeLegacyState fills what dst lacks from src and returns what it took
// ("agent shell", "home volume of shell", "secret GH", "trust"). dst's
// values always win. The VM, fingerprint and image of a legacy agent
// describe the destroyed legacy VM and are not taken. A home volume that
// differs from dst's is noted in notes (it stays on the engine).
func mergeLegacyState(dst, src *State, notes *[]string) []string {
	var taken []string
	agents := make([]string, 0, len(src.Agents))
	for a := range src.Agents {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	for _, name := range agents {
		la := src.Agents[name]
		if la == nil {
			continue
		}
		da := dst.Agents[name]
		if da == nil {
			c := *la
			c.VM, c.Fingerprint, c.ImageID = "", "", ""
			c.Provisioned = maps.Clone(la.Provisioned)
			c.Placeholders = maps.Clone(la.Placeholders)
			if dst.Agents == nil {
				dst.Agents = map[string]*AgentState{}
			}
			dst.Agents[name] = &c
			taken = append(taken, "agent "+name)
			continue
		}
		switch {
		case la.HomeVolume == "":
		case da.HomeVolume == "":
			da.HomeVolume = la.HomeVolume
			taken = append(taken, "home volume of "+name)
		case da.HomeVolume != la.HomeVolume:
			*notes = append(*notes, fmt.Sprintf("the legacy state recorded home volume %s for %s, but this checkout uses %s: %s is kept on the engine, unused (remove it yourself once you no longer need it)", la.HomeVolume, name, da.HomeVolume, la.HomeVolume))
		}
		if len(da.Provisioned) == 0 && len(la.Provisioned) > 0 && da.HomeVolume == la.HomeVolume {
			da.Provisioned = maps.Clone(la.Provisioned)
			taken = append(taken, "provisioning record of "+name)
		}
		if len(da.Placeholders) == 0 && len(la.Placeholders) > 0 {
			da.Placeholders = maps.Clone(la.Placeholders)
			taken = append(taken, "secret placeholders of "+name)
		}
		if da.ProxyToken == "" && la.ProxyToken != "" {
			da.ProxyToken = la.ProxyToken
			taken = append(taken, "proxy token of "+name)
		}
		if da.CreatedAt.IsZero() && !la.CreatedAt.IsZero() {
			da.CreatedAt = la.CreatedAt
		}
		if da.LastUsed.IsZero() && !la.LastUsed.IsZero() {
			da.LastUsed = la.LastUsed
		}
	}
	secrets := make([]string, 0, len(src.Secrets))
	for n := range src.Secrets {
		secrets = append(secrets, n)
	}
	sort.Strings(secrets)
	for _, n := range secrets {
		if _, ok := dst.Secrets[n]; ok {
			continue
		}
		if dst.Secrets == nil {
			dst.Secrets = map[string]SecretConfig{}
		}
		dst.Secrets[n] = src.Secrets[n]
		taken = append(taken, "secret "+n)
	}
	if dst.TrustedProjectConfig == "" && src.TrustedProjectConfig != "" {
		dst.TrustedProjectConfig = src.TrustedProjectConfig
		taken = append(taken, "trust in the project config")
	}
	return taken
}

// warnings are the lines the user sees about this migration.
func (mg *migration) warnings() []string {
	rep := mg.rep
	tense := func(future, past string) string {
		if rep.DryRun {
			return future
		}
		return past
	}
	var what []string
	moved, dropped := 0, 0
	for _, a := range rep.Actions {
		switch a.Step {
		case StepRecordVolume:
			what = append(what, fmt.Sprintf("%s home volume %s for %s", tense("keep", "kept"), a.Target, a.Agent))
		case StepDestroyVM:
			what = append(what, tense("destroy", "destroyed")+" legacy VM "+a.Target)
		case StepMergeState:
			what = append(what, tense("merge", "merged")+" the legacy state.json ("+a.Detail+")")
		case StepMove:
			moved++
		case StepDrop:
			dropped++
		}
	}
	if moved > 0 {
		what = append(what, fmt.Sprintf("%s %s of %s into %s", tense("move", "moved"), plural(moved, "entry", "entries"), rep.LegacyStateDir, rep.StateDir))
	}
	if dropped > 0 {
		what = append(what, fmt.Sprintf("%s %s the checkout already has", tense("drop", "dropped"), plural(dropped, "legacy file", "legacy files")))
	}
	if n := len(rep.Actions); n > 0 && rep.Actions[n-1].Step == StepRemoveDir {
		what = append(what, tense("remove", "removed")+" "+rep.LegacyStateDir)
	}
	head := "found the origin-keyed layout of an earlier agents-sandbox (keyed by the remote, " + rep.RepoSlug + ", and shared by every clone of it)"
	var out []string
	switch {
	case len(what) == 0:
		out = append(out, head+"; what is left of it cannot move into this checkout's own layout by itself:")
	case rep.DryRun:
		out = append(out, head+"; the first run that is not a dry run migrates it to this checkout's own layout: it will "+strings.Join(what, "; "))
	default:
		out = append(out, head+"; migrated it to this checkout's own layout: "+strings.Join(what, "; "))
	}
	out = append(out, mg.notes...)
	for _, k := range rep.Kept {
		verb := "could not move"
		if rep.DryRun {
			verb = "will not be able to move"
		}
		out = append(out, fmt.Sprintf("%s %s: %s; it stays where it is", verb, k.Path, k.Reason))
	}
	return out
}

// LegacyArtifact is an artifact of the origin-keyed layout on the engine.
type LegacyArtifact struct {
	Kind    Kind              `json:"kind"` // vm, home or runner
	Name    string            `json:"name"` // VM or volume name; an image's first tag, else its ID
	Project string            `json:"project"`
	Agent   string            `json:"agent"`
	State   VMState           `json:"state,omitempty"` // VMs only
	Created time.Time         `json:"created"`
	Labels  map[string]string `json:"labels"`
}

// LegacyArtifacts lists the artifacts of the origin-keyed layout, found by
// their labels (kind vm, home or runner, and no checkout label), sorted by
// kind and name. repoSlug limits the list to one remote; "" lists every
// remote's. Listing and pruning need it because those artifacts carry no
// org.agents-sandbox.checkout label; legacy-prefixed artifacts
// (agents-sandbox-<checkout-slug>-…) carry every label and are found like
// current ones. Errors: the engine's.
func (m *Manager) LegacyArtifacts(ctx context.Context, repoSlug string) ([]LegacyArtifact, error) {
	sel := func(k Kind) map[string]string {
		l := map[string]string{LabelKind: string(k)}
		if repoSlug != "" {
			l[LabelProject] = repoSlug
		}
		return l
	}
	legacy := func(labels map[string]string) bool {
		_, ok := labels[LabelCheckout]
		return !ok && labels[LabelProject] != ""
	}
	var out []LegacyArtifact
	vms, err := m.RT.ListVMs(ctx, sel(KindVM))
	if err != nil {
		return nil, fmt.Errorf("list legacy VMs: %w", err)
	}
	for _, vm := range vms {
		if legacy(vm.Labels) {
			out = append(out, LegacyArtifact{Kind: KindVM, Name: vm.Name, Project: vm.Labels[LabelProject], Agent: vm.Labels[LabelAgent], State: vm.State, Created: vm.Created, Labels: vm.Labels})
		}
	}
	vols, err := m.RT.ListVolumes(ctx, sel(KindHome))
	if err != nil {
		return nil, fmt.Errorf("list legacy volumes: %w", err)
	}
	for _, v := range vols {
		if legacy(v.Labels) {
			out = append(out, LegacyArtifact{Kind: KindHome, Name: v.Name, Project: v.Labels[LabelProject], Agent: v.Labels[LabelAgent], Created: v.Created, Labels: v.Labels})
		}
	}
	imgs, err := m.RT.ListImages(ctx, sel(KindRunner))
	if err != nil {
		return nil, fmt.Errorf("list legacy images: %w", err)
	}
	for _, img := range imgs {
		if legacy(img.Labels) {
			name := img.ID
			if len(img.Tags) > 0 {
				name = img.Tags[0]
			}
			out = append(out, LegacyArtifact{Kind: KindRunner, Name: name, Project: img.Labels[LabelProject], Agent: img.Labels[LabelAgent], Created: img.Created, Labels: img.Labels})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// OpenProject is Open for a command that acts on the project: it resolves
// the project, runs the migration from the origin-keyed layout (a dry run
// with dryRun), then checks trust (unless opts.SkipTrust or dryRun; the
// trusted hash may only be in the legacy state before the migration). The
// report's Warnings are for the caller to show (stderr, tool result text).
func (m *Manager) OpenProject(ctx context.Context, opts OpenOptions, dryRun bool) (*Project, MigrationReport, error) {
	skip := opts.SkipTrust
	opts.SkipTrust = true
	p, err := m.Open(opts)
	if err != nil {
		return nil, MigrationReport{}, err
	}
	rep, err := m.Migrate(ctx, p, MigrateOptions{DryRun: dryRun})
	if err != nil {
		return nil, rep, err
	}
	if !skip && !dryRun {
		if err := m.CheckTrust(p, opts.Trust); err != nil {
			return nil, rep, err
		}
	}
	return p, rep, nil
}
