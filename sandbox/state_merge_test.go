package sandbox_test

import (
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// Two writers that loaded the same state and changed different parts must
// not lose each other's updates.
func TestSaveStateMergesConcurrentWriters(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seed, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	seed.Agent("shell").HomeVolume = "vol-shell"
	seed.Agent("codex").HomeVolume = "vol-codex"
	if err := sandbox.SaveState(dir, seed); err != nil {
		t.Fatal(err)
	}

	a, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	a.Agent("shell").VM = "vm-shell"
	b.Agent("codex").VM = "vm-codex"
	b.Secrets = map[string]sandbox.SecretConfig{"GH": {From: "env:GH", Hosts: []string{"api.github.com"}}}
	b.TrustedProjectConfig = "abc"
	delete(b.Agents, "opencode") // absent before too: no change
	if err := sandbox.SaveState(dir, a); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.SaveState(dir, b); err != nil {
		t.Fatal(err)
	}
	got, err := sandbox.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Agents["shell"] == nil || got.Agents["shell"].VM != "vm-shell" || got.Agents["shell"].HomeVolume != "vol-shell" {
		t.Errorf("shell agent lost the first writer's update: %+v", got.Agents["shell"])
	}
	if got.Agents["codex"] == nil || got.Agents["codex"].VM != "vm-codex" {
		t.Errorf("codex agent lost the second writer's update: %+v", got.Agents["codex"])
	}
	if got.Secrets["GH"].From != "env:GH" || got.TrustedProjectConfig != "abc" {
		t.Errorf("secrets/trust lost: %+v %q", got.Secrets, got.TrustedProjectConfig)
	}
	// The first writer's in-memory state is the merged result, and its
	// agent pointers stay valid.
	shell := a.Agent("shell")
	shell.LastUsed = shell.LastUsed.Add(1)
	if err := sandbox.SaveState(dir, a); err != nil {
		t.Fatal(err)
	}
	got, _ = sandbox.LoadState(dir)
	if got.Agents["codex"] == nil || got.Agents["codex"].VM != "vm-codex" || got.TrustedProjectConfig != "abc" {
		t.Errorf("a later save of the first writer dropped the second writer's parts: %+v", got)
	}
	// Removing an agent is a change too.
	c, _ := sandbox.LoadState(dir)
	delete(c.Agents, "codex")
	if err := sandbox.SaveState(dir, c); err != nil {
		t.Fatal(err)
	}
	got, _ = sandbox.LoadState(dir)
	if _, ok := got.Agents["codex"]; ok {
		t.Errorf("a removed agent came back")
	}
}
