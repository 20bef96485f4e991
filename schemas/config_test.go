package schemas_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agents-sandbox/agents-sandbox/schemas"
)

// noRemote refuses every URL: schemas must be self-contained (the draft
// meta-schemas are built into the validator and never loaded).
type noRemote struct{}

func (noRemote) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema refers to %s: schemas must be self-contained", url)
}

func compile(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	raw, err := schemas.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noRemote{})
	if err := c.AddResource(name, doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	s, err := c.Compile(name)
	if err != nil {
		t.Fatalf("%s does not compile: %v", name, err)
	}
	return s
}

func TestNamesAndGet(t *testing.T) {
	t.Parallel()
	names := schemas.Names()
	if !slices.IsSorted(names) || !slices.Contains(names, "config.schema.json") {
		t.Fatalf("Names() = %v, want a sorted list holding config.schema.json", names)
	}
	for _, n := range names {
		if !strings.HasSuffix(n, ".json") {
			t.Errorf("Names() holds %q", n)
		}
		b, err := schemas.Get(n)
		if err != nil || !json.Valid(b) {
			t.Errorf("Get(%q): valid JSON = %v, err = %v", n, json.Valid(b), err)
		}
	}
	// The caller owns the bytes.
	a, _ := schemas.Get("config.schema.json")
	a[0] = 'X'
	if b, _ := schemas.Get("config.schema.json"); b[0] == 'X' {
		t.Error("Get returns shared bytes")
	}
	for _, bad := range []string{"nope.json", "", ".", "../go.mod", "/config.schema.json", "config"} {
		if _, err := schemas.Get(bad); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("Get(%q): err = %v, want fs.ErrNotExist naming it", bad, err)
		}
	}
}

// TestEverySchemaCompiles: each embedded schema compiles on its own; a
// schema that does not is silently not enforced by mcp-go.
func TestEverySchemaCompiles(t *testing.T) {
	t.Parallel()
	for _, n := range schemas.Names() {
		compile(t, n)
	}
}

// TestConfigSchemaRules: draft 2020-12, additionalProperties on every object
// (false, or a schema for tables keyed by user-chosen names), items on every
// array, a description on every property, only local references.
func TestConfigSchemaRules(t *testing.T) {
	t.Parallel()
	raw, err := schemas.Get("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(raw, &root); err != nil {
		t.Fatal(err)
	}
	if root["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %v, want draft 2020-12", root["$schema"])
	}
	var problems []string
	var walk func(path string, s map[string]any)
	walk = func(path string, s map[string]any) {
		if ref, ok := s["$ref"].(string); ok && !strings.HasPrefix(ref, "#/$defs/") {
			problems = append(problems, path+": $ref "+ref+" is not local")
		}
		switch s["type"] {
		case "object":
			ap, ok := s["additionalProperties"]
			if !ok {
				problems = append(problems, path+": object without additionalProperties")
			} else if b, isBool := ap.(bool); isBool && b {
				problems = append(problems, path+": additionalProperties true")
			}
		case "array":
			if _, ok := s["items"].(map[string]any); !ok {
				problems = append(problems, path+": array without items")
			}
		}
		if props, ok := s["properties"].(map[string]any); ok {
			keys := make([]string, 0, len(props))
			for k := range props {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				p := props[k].(map[string]any)
				if d, _ := p["description"].(string); strings.TrimSpace(d) == "" {
					problems = append(problems, path+".properties."+k+": no description")
				}
				walk(path+".properties."+k, p)
			}
		}
		for _, kw := range []string{"items", "additionalProperties", "propertyNames", "not", "if", "then", "else"} {
			if sub, ok := s[kw].(map[string]any); ok {
				walk(path+"."+kw, sub)
			}
		}
		for _, kw := range []string{"oneOf", "anyOf", "allOf"} {
			if subs, ok := s[kw].([]any); ok {
				for i, sub := range subs {
					walk(fmt.Sprintf("%s.%s[%d]", path, kw, i), sub.(map[string]any))
				}
			}
		}
		if defs, ok := s["$defs"].(map[string]any); ok {
			for k, d := range defs {
				walk(path+".$defs."+k, d.(map[string]any))
			}
		}
	}
	walk("#", root)
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
	compile(t, "config.schema.json")
}

func TestConfigSchemaValidates(t *testing.T) {
	t.Parallel()
	s := compile(t, "config.schema.json")
	for _, c := range []struct {
		doc string
		ok  bool
	}{
		{`{}`, true},
		{`{"agent": "codex", "idle_timeout": "1h30m", "resources": {"cpus": 1.5, "memory": "4g", "pids": 100}}`, true},
		{`{"idle_timeout": "0"}`, true},
		{`{"idle_timeout": 30}`, false},
		{`{"idle_timeout": "30"}`, false},
		{`{"idle_timeout": "-5m"}`, false},
		{`{"Agent": "x"}`, false},
		{`{"network": {"mode": "wide"}}`, false},
		{`{"home": {".gitconfig": "", ".ssh": {"source": "/k", "optional": true}}}`, true},
		{`{"home": {".x": 1}}`, false},
		{`{"home": {"/etc/x": "/x"}}`, false},
		{`{"home": {"a/../../x": "/x"}}`, false},
		{`{"home": {".x": {"src": "/x"}}}`, false},
		{`{"secrets": {"GH": {"from": "env:GH", "hosts": ["github.com"]}}}`, true},
		{`{"secrets": {"GH": {"from": "vault:GH"}}}`, false},
		{`{"secrets": {"my-token": {"from": "env:X"}}}`, false},
		{`{"mounts": [{"source": "/a", "target": "/b"}]}`, true},
		{`{"mounts": [{"source": "/a", "target": "b"}]}`, false},
		{`{"mounts": [{"target": "/b"}]}`, false},
		{`{"resources": {"memory": "lots"}}`, false},
		{`{"env": {"A=B": "x"}}`, false},
	} {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(c.doc))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(doc); (err == nil) != c.ok {
			t.Errorf("Validate(%s) = %v, want ok = %v", c.doc, err, c.ok)
		}
	}
}
