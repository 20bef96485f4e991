package tools_test

import (
	"encoding/json"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/schemas"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// registry returns every tool over a manager that never connects: the
// tests here only look at the tools as data.
func registry(t *testing.T) *tools.Registry {
	t.Helper()
	return tools.All(tools.Deps{Core: &sandbox.Manager{}})
}

func readSchema(t *testing.T, name string) map[string]any {
	t.Helper()
	raw, err := schemas.Get(name)
	if err != nil {
		t.Fatalf("schema %s: %v", name, err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("schema %s: %v", name, err)
	}
	return m
}

func TestEveryToolIsDescribed(t *testing.T) {
	want := []string{"sandbox_attach", "sandbox_create", "sandbox_exec", "sandbox_list", "sandbox_provision",
		"sandbox_remove", "sandbox_spawn_task", "sandbox_status", "sandbox_stop", "secret_proxy"}
	var got []string
	for _, tool := range registry(t).Tools() {
		got = append(got, tool.Name)
		t.Run(tool.Name, func(t *testing.T) {
			if len(tool.Description) < 80 {
				t.Errorf("description too short to tell a model when to use the tool: %q", tool.Description)
			}
			if tool.Title == "" {
				t.Error("no title")
			}
			h := tool.Hints
			for name, v := range map[string]tools.Hint{"read-only": h.ReadOnly, "destructive": h.Destructive, "idempotent": h.Idempotent, "open-world": h.OpenWorld} {
				if v == tools.HintUnset {
					t.Errorf("%s hint not set", name)
				}
			}
			if h.ReadOnly == tools.Yes && h.Destructive == tools.Yes {
				t.Error("read-only and destructive at once")
			}
			if tool.InputSchema != tool.Name+".input.json" || tool.OutputSchema != tool.Name+".output.json" {
				t.Errorf("schema names %q, %q", tool.InputSchema, tool.OutputSchema)
			}
		})
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tools = %v, want %v", got, want)
	}
}

// TestSchemaFilesBelongToTools: no stray tool schema files.
func TestSchemaFilesBelongToTools(t *testing.T) {
	names := map[string]bool{}
	for _, tool := range registry(t).Tools() {
		names[tool.InputSchema], names[tool.OutputSchema] = true, true
	}
	var files []string
	for _, f := range schemas.Names() {
		if strings.HasSuffix(f, ".input.json") || strings.HasSuffix(f, ".output.json") {
			files = append(files, f)
		}
	}
	if len(files) != len(names) {
		t.Errorf("%d tool schema files embedded, %d expected", len(files), len(names))
	}
	for _, f := range files {
		if !names[f] {
			t.Errorf("%s belongs to no tool", f)
		}
	}
}

func TestSchemasCompileAndFollowTheRules(t *testing.T) {
	for _, tool := range registry(t).Tools() {
		for _, name := range []string{tool.InputSchema, tool.OutputSchema} {
			t.Run(name, func(t *testing.T) {
				raw, err := schemas.Get(name)
				if err != nil {
					t.Fatal(err)
				}
				doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
				if err != nil {
					t.Fatal(err)
				}
				c := jsonschema.NewCompiler()
				c.UseLoader(refusingLoader{t})
				if err := c.AddResource("mem:///"+name, doc); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Compile("mem:///" + name); err != nil {
					t.Fatalf("does not compile: %v", err)
				}
				m := readSchema(t, name)
				if m["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
					t.Errorf("$schema = %v, want draft 2020-12", m["$schema"])
				}
				if m["type"] != "object" {
					t.Errorf("top level type %v: MCP needs an object", m["type"])
				}
				if strings.Contains(string(raw), `"$ref"`) {
					t.Error("uses $ref: schemas must be self-contained and simple")
				}
				checkRules(t, "#", m)
			})
		}
	}
}

type refusingLoader struct{ t *testing.T }

func (l refusingLoader) Load(url string) (any, error) {
	l.t.Errorf("schema refers to another document: %s", url)
	return nil, os.ErrNotExist
}

// checkRules: every object has additionalProperties false and properties,
// every array has items, every property a description.
func checkRules(t *testing.T, at string, s map[string]any) {
	t.Helper()
	switch s["type"] {
	case "object":
		if s["additionalProperties"] != false {
			t.Errorf("%s: object without additionalProperties: false", at)
		}
		props, ok := s["properties"].(map[string]any)
		if !ok {
			t.Errorf("%s: object without properties", at)
		}
		for _, r := range asList(s["required"]) {
			if _, ok := props[r.(string)]; !ok {
				t.Errorf("%s: required %q is not a property", at, r)
			}
		}
		for name, p := range props {
			ps := p.(map[string]any)
			if d, _ := ps["description"].(string); d == "" {
				t.Errorf("%s/properties/%s: no description", at, name)
			}
			checkRules(t, at+"/properties/"+name, ps)
		}
	case "array":
		items, ok := s["items"].(map[string]any)
		if !ok {
			t.Errorf("%s: array without items", at)
			return
		}
		checkRules(t, at+"/items", items)
	case "string", "integer", "number", "boolean":
	default:
		t.Errorf("%s: type %v: every schema names one type", at, s["type"])
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// TestSchemasMatchGoTypes checks each schema against the Go struct the tool
// decodes into or encodes from, both ways: every JSON field is a property
// of the same type and every property a field; required properties are
// exactly the fields without omitempty.
func TestSchemasMatchGoTypes(t *testing.T) {
	for _, tool := range registry(t).Tools() {
		t.Run(tool.InputSchema, func(t *testing.T) {
			matchType(t, "#", tool.InputType(), readSchema(t, tool.InputSchema))
		})
		t.Run(tool.OutputSchema, func(t *testing.T) {
			matchType(t, "#", tool.OutputType(), readSchema(t, tool.OutputSchema))
		})
	}
}

var timeType = reflect.TypeFor[time.Time]()

func matchType(t *testing.T, at string, typ reflect.Type, s map[string]any) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	want := ""
	switch typ.Kind() {
	case reflect.Struct:
		if typ == timeType {
			want = "string"
			break
		}
		want = "object"
	case reflect.Slice:
		want = "array"
	case reflect.String:
		want = "string"
	case reflect.Bool:
		want = "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "integer"
	case reflect.Float32, reflect.Float64:
		want = "number"
	default:
		t.Errorf("%s: Go type %s has no JSON Schema counterpart here (maps are not allowed: objects are closed)", at, typ)
		return
	}
	if s["type"] != want {
		t.Errorf("%s: schema type %v, Go type %s wants %s", at, s["type"], typ, want)
		return
	}
	switch want {
	case "array":
		items, _ := s["items"].(map[string]any)
		matchType(t, at+"/items", typ.Elem(), items)
	case "object":
		fields := jsonFields(typ)
		props, _ := s["properties"].(map[string]any)
		required := map[string]bool{}
		for _, r := range asList(s["required"]) {
			required[r.(string)] = true
		}
		var names []string
		for n := range fields {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			f := fields[n]
			p, ok := props[n].(map[string]any)
			if !ok {
				t.Errorf("%s: Go field %s (json %q) is not in the schema", at, f.name, n)
				continue
			}
			if required[n] == f.omitempty {
				t.Errorf("%s/properties/%s: required=%v but the Go field has omitempty=%v", at, n, required[n], f.omitempty)
			}
			matchType(t, at+"/properties/"+n, f.typ, p)
		}
		for n := range props {
			if _, ok := fields[n]; !ok {
				t.Errorf("%s: schema property %q has no Go field in %s", at, n, typ)
			}
		}
	}
}

type field struct {
	name      string
	typ       reflect.Type
	omitempty bool
}

// jsonFields lists a struct's JSON fields as encoding/json sees them
// (embedded structs without a tag are flattened).
func jsonFields(typ reflect.Type) map[string]field {
	out := map[string]field{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for n, ff := range jsonFields(f.Type) {
				out[n] = ff
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = field{name: f.Name, typ: f.Type, omitempty: strings.Contains(","+opts+",", ",omitempty,")}
	}
	return out
}
