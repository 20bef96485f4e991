package sandbox_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/schemas"
)

func configSchema(t *testing.T) map[string]any {
	t.Helper()
	raw, err := schemas.Get("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConfigSchemaMatchesStruct walks sandbox.Config by reflection (toml
// tags) next to schemas/config.schema.json: every field has a property of a
// compatible type, and every property is a field.
func TestConfigSchemaMatchesStruct(t *testing.T) {
	t.Parallel()
	root := configSchema(t)
	defs, _ := root["$defs"].(map[string]any)
	var problems []string
	bad := func(path, format string, args ...any) {
		problems = append(problems, path+": "+fmt.Sprintf(format, args...))
	}
	deref := func(path string, s map[string]any) map[string]any {
		if ref, ok := s["$ref"].(string); ok {
			d, ok := defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
			if !ok {
				bad(path, "unresolved $ref %s", ref)
				return map[string]any{}
			}
			return d
		}
		return s
	}
	durationType := reflect.TypeFor[sandbox.Duration]()
	homeType := reflect.TypeFor[sandbox.HomeMapping]()
	modeType := reflect.TypeFor[sandbox.NetworkMode]()

	var walk func(path string, typ reflect.Type, s map[string]any)
	walkStruct := func(path string, typ reflect.Type, s map[string]any) {
		if s["type"] != "object" || s["additionalProperties"] != false {
			bad(path, "struct %s needs type object and additionalProperties false", typ)
		}
		props, _ := s["properties"].(map[string]any)
		fields := map[string]bool{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				bad(path, "field %s has no toml tag", f.Name)
				continue
			}
			fields[name] = true
			p, ok := props[name].(map[string]any)
			if !ok {
				bad(path, "field %s (%s) is not in the schema", f.Name, name)
				continue
			}
			walk(path+"."+name, f.Type, p)
		}
		for name := range props {
			if !fields[name] {
				bad(path, "schema property %q is no field of %s", name, typ)
			}
		}
	}
	walk = func(path string, typ reflect.Type, s map[string]any) {
		s = deref(path, s)
		switch {
		case typ == durationType:
			if s["type"] != "string" || s["pattern"] == nil {
				bad(path, "Duration needs a string with a pattern, got %v", s["type"])
			}
			return
		case typ == homeType:
			alts, _ := s["oneOf"].([]any)
			var kinds []string
			for _, a := range alts {
				a := a.(map[string]any)
				kinds = append(kinds, fmt.Sprint(a["type"]))
				if a["type"] == "object" {
					walkStruct(path, typ, a)
				}
			}
			sort.Strings(kinds)
			if !reflect.DeepEqual(kinds, []string{"object", "string"}) {
				bad(path, "HomeMapping needs oneOf string or object, got %v", kinds)
			}
			return
		case typ == modeType:
			enum, _ := s["enum"].([]any)
			want := []any{string(sandbox.NetworkProxy), string(sandbox.NetworkOpen), string(sandbox.NetworkNone)}
			if s["type"] != "string" || !reflect.DeepEqual(enum, want) {
				bad(path, "NetworkMode needs a string enum %v, got %v", want, enum)
			}
			return
		}
		want := map[reflect.Kind]string{
			reflect.String: "string", reflect.Bool: "boolean",
			reflect.Int: "integer", reflect.Int32: "integer", reflect.Int64: "integer",
			reflect.Float32: "number", reflect.Float64: "number",
			reflect.Slice: "array", reflect.Map: "object", reflect.Struct: "object",
		}[typ.Kind()]
		if want == "" {
			bad(path, "Go type %s has no schema mapping in this test", typ)
			return
		}
		if s["type"] != want {
			bad(path, "Go %s wants schema type %s, got %v", typ, want, s["type"])
			return
		}
		switch typ.Kind() {
		case reflect.Slice:
			items, ok := s["items"].(map[string]any)
			if !ok {
				bad(path, "array without items")
				return
			}
			walk(path+"[]", typ.Elem(), items)
		case reflect.Map:
			if typ.Key().Kind() != reflect.String {
				bad(path, "map key %s is not a string", typ.Key())
			}
			ap, ok := s["additionalProperties"].(map[string]any)
			if !ok {
				bad(path, "a table keyed by names needs additionalProperties with a schema")
				return
			}
			walk(path+".*", typ.Elem(), ap)
		case reflect.Struct:
			walkStruct(path, typ, s)
		}
	}
	walk("config", reflect.TypeFor[sandbox.Config](), root)
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// jsonable turns a decoded TOML value into what encoding/json writes, with
// TOML dates and times as objects, so that no string schema accepts them.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case []map[string]any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case time.Time:
		return map[string]any{"toml-datetime": x.String()}
	}
	return v
}

// TestConfigFixtures checks every sandbox/testdata/config/*.toml against
// both judges: LoadConfig (as the project layer over the defaults) and the
// JSON Schema. valid-* files pass both; invalid-* files fail both.
func TestConfigFixtures(t *testing.T) {
	t.Parallel()
	raw, err := schemas.Get("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("config.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	schema, err := c.Compile("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join("testdata", "config", "*.toml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	var valid, invalid int
	for _, f := range files {
		base := filepath.Base(f)
		wantValid := strings.HasPrefix(base, "valid-")
		if !wantValid && !strings.HasPrefix(base, "invalid-") {
			t.Errorf("%s: fixture names start with valid- or invalid-", f)
			continue
		}
		if wantValid {
			valid++
		} else {
			invalid++
		}
		t.Run(strings.TrimSuffix(base, ".toml"), func(t *testing.T) {
			t.Parallel()
			_, goErr := sandbox.LoadConfig(sandbox.ConfigSources{ProjectFile: f})
			if (goErr == nil) != wantValid {
				t.Errorf("LoadConfig: err = %v, want valid = %v", goErr, wantValid)
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if _, err := toml.Decode(string(data), &m); err != nil {
				if wantValid {
					t.Errorf("TOML does not parse: %v", err)
				}
				return // not TOML: only LoadConfig can judge it
			}
			js, err := json.Marshal(jsonable(m))
			if err != nil {
				t.Fatal(err)
			}
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
			if err != nil {
				t.Fatal(err)
			}
			schemaErr := schema.Validate(inst)
			if (schemaErr == nil) != wantValid {
				t.Errorf("schema: err = %v, want valid = %v\ndocument: %s", schemaErr, wantValid, js)
			}
			if !wantValid {
				t.Logf("LoadConfig: %v\nschema: %s", goErr, strings.Join(strings.Fields(fmt.Sprint(schemaErr)), " "))
			}
		})
	}
	if valid == 0 || invalid == 0 {
		t.Errorf("%d valid and %d invalid fixtures; want some of each", valid, invalid)
	}
	// The full fixture uses every key of the schema.
	data, err := os.ReadFile(filepath.Join("testdata", "config", "valid-full.toml"))
	if err != nil {
		t.Fatal(err)
	}
	md, err := toml.Decode(string(data), &map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, k := range md.Keys() {
		used = append(used, k.String())
	}
	for _, k := range []string{"agent", "runtime", "oci_runtime", "idle_timeout", "image.base", "image.ca_certificates",
		"resources.cpus", "resources.memory", "resources.pids", "network.mode", "network.allow", "network.deny",
		"secrets.GITHUB_TOKEN.body", "mounts.read_only", "agents.mine.needs_node", "agents.mine.snippets"} {
		if !slices.Contains(used, k) {
			t.Errorf("valid-full.toml does not set %s", k)
		}
	}
}
