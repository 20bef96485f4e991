package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/schemas"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// TestWorktreeArgument: a worktree argument whose NAME is not a branch name
// is invalid params at /worktree, before any project is opened; the input
// schemas refuse an empty BASE and a leading '-'.
func TestWorktreeArgument(t *testing.T) {
	testenv.RequireGit(t)
	r := registry(t)
	for _, name := range []string{"sandbox_exec", "sandbox_attach", "sandbox_spawn_task"} {
		tool, ok := r.Lookup(name)
		if !ok {
			t.Fatalf("no tool %s", name)
		}
		for _, spec := range []string{"bad..name", "a b", "fix:", "x:-rf"} {
			in, _ := json.Marshal(map[string]any{"checkout": "/nonexistent", "cmd": []string{"true"}, "worktree": spec})
			if name == "sandbox_attach" {
				in, _ = json.Marshal(map[string]any{"checkout": "/nonexistent", "worktree": spec})
			}
			_, err := tool.Call(context.Background(), tools.Call{}, in)
			var te *tools.Error
			if !errors.As(err, &te) || te.Code != tools.CodeInvalidParams || te.Pointer != "/worktree" {
				t.Errorf("%s with worktree %q: %v; want invalid params at /worktree", name, spec, err)
			}
		}

		raw, err := schemas.Get(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource(tool.InputSchema, doc); err != nil {
			t.Fatal(err)
		}
		sch, err := c.Compile(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		for spec, valid := range map[string]bool{"fix": true, "fix:main": true, "feat/x:HEAD~2": true, "fix:": false, "-x": false, "x:-rf": false, ":main": false, "": false} {
			v := map[string]any{"checkout": "/x", "cmd": []any{"true"}, "worktree": spec}
			if name == "sandbox_attach" {
				delete(v, "cmd")
			}
			if err := sch.Validate(v); (err == nil) != valid {
				t.Errorf("%s schema on worktree %q: %v, want valid=%v", name, spec, err, valid)
			}
		}
	}
}
