package provision

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/tailscale/hujson"
)

// Format is the syntax of a config file or snippet.
type Format string

// The formats provisioning reads and writes.
const (
	// FormatJSON is JSON in, JSON out. Snippets may be JSONC (comments,
	// trailing commas); the merged output is plain JSON, which is also valid
	// JSONC, so it serves agents reading either.
	FormatJSON Format = "json"
	// FormatTOML is TOML in, TOML out.
	FormatTOML Format = "toml"
)

// FormatOf returns the format of a file by its extension: ".json" and
// ".jsonc" are FormatJSON, ".toml" is FormatTOML. Errors: any other extension.
func FormatOf(name string) (Format, error) {
	switch strings.ToLower(path.Ext(name)) {
	case ".json", ".jsonc":
		return FormatJSON, nil
	case ".toml":
		return FormatTOML, nil
	}
	return "", fmt.Errorf("format of %q: unknown extension (want .json, .jsonc or .toml)", name)
}

// Snippet is one config fragment to merge.
type Snippet struct {
	// Name identifies the snippet in errors and warnings (its host path).
	Name string
	// Data is the snippet's content: JSON/JSONC or TOML, by Format.
	Data []byte
	// Format is the snippet's syntax. Empty means the format of Name's
	// extension, or failing that the output format.
	Format Format
}

// SnippetError is a snippet that does not parse, or whose value cannot be
// merged or written. Line and Column are 1-based (Column counts bytes) and 0
// when the problem has no position.
type SnippetError struct {
	File   string
	Line   int
	Column int
	Msg    string
	Err    error // the parser's error, when there is one
}

func (e *SnippetError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
	}
	return e.File + ": " + e.Msg
}

func (e *SnippetError) Unwrap() error { return e.Err }

// Warning is a problem provisioning resolved on its own and reports so the
// caller can log it.
type Warning struct {
	// Source is the host path (snippet, mirrored file, mapping source) or the
	// home mapping ("home mapping \".ssh\"") the warning is about.
	Source string `json:"source"`
	// Key is the dotted config key, for merge warnings.
	Key string `json:"key,omitempty"`
	// Message says what happened and what was done about it.
	Message string `json:"message"`
}

func (w Warning) String() string {
	if w.Key != "" {
		return fmt.Sprintf("%s: key %s: %s", w.Source, w.Key, w.Message)
	}
	return w.Source + ": " + w.Message
}

// Merge merges snippets, lowest first, and encodes the result in out.
//
// Objects (TOML tables) merge key by key, recursively; arrays and scalars
// from a later snippet replace earlier ones; an explicit JSON null deletes the
// key (TOML has no null, so TOML snippets cannot delete). When two snippets
// disagree on a key's type (object vs string, say) the later one wins and a
// Warning names both files. Nulls inside arrays are kept as they are (in
// JSON output).
//
// The output is deterministic: JSON is indented by two spaces with keys
// sorted and a trailing newline, HTML characters unescaped; TOML has keys
// sorted and no indentation. Errors: *SnippetError for a snippet that does
// not parse or is not an object, or for a value out cannot represent (a null
// in an array or a JSON number out of range for TOML; NaN or infinity for
// JSON).
func Merge(snippets []Snippet, out Format) ([]byte, []Warning, error) {
	if out != FormatJSON && out != FormatTOML {
		return nil, nil, fmt.Errorf("merge: unknown output format %q", out)
	}
	m := merger{root: map[string]any{}}
	for _, s := range snippets {
		f := s.Format
		if f == "" {
			if ef, err := FormatOf(s.Name); err == nil {
				f = ef
			} else {
				f = out
			}
		}
		v, err := parseSnippet(s.Name, s.Data, f)
		if err != nil {
			return nil, m.warnings, err
		}
		m.merge(m.root, v, nil, s.Name)
	}
	b, err := encode(m.root, out, lastName(snippets))
	if err != nil {
		return nil, m.warnings, err
	}
	return b, m.warnings, nil
}

func lastName(s []Snippet) string {
	if len(s) == 0 {
		return "merged config"
	}
	return s[len(s)-1].Name
}

// parseSnippet returns the snippet as a map: JSON objects as map[string]any
// with json.Number numbers and nil for null, TOML tables as BurntSushi/toml
// decodes them.
func parseSnippet(name string, data []byte, f Format) (map[string]any, error) {
	switch f {
	case FormatTOML:
		var m map[string]any
		if _, err := toml.Decode(string(data), &m); err != nil {
			var pe toml.ParseError
			if errors.As(err, &pe) {
				return nil, &SnippetError{File: name, Line: pe.Position.Line, Column: pe.Position.Col, Msg: pe.Message, Err: err}
			}
			return nil, &SnippetError{File: name, Msg: err.Error(), Err: err}
		}
		if m == nil {
			m = map[string]any{}
		}
		return m, nil
	case FormatJSON:
		return parseJSONC(name, data)
	}
	return nil, &SnippetError{File: name, Msg: fmt.Sprintf("unknown format %q", f)}
}

func parseJSONC(name string, data []byte) (map[string]any, error) {
	v, err := hujson.Parse(data)
	if err != nil {
		if isEmptyJSONC(data) {
			return map[string]any{}, nil
		}
		// hujson reports the position only inside its message.
		se := &SnippetError{File: name, Msg: err.Error(), Err: err}
		se.Line, se.Column, se.Msg = hujsonPosition(err.Error())
		return nil, se
	}
	// Standardize replaces comments and trailing commas by spaces, keeping
	// every byte offset, so encoding/json's offsets still point into data.
	v.Standardize()
	std := v.Pack()
	dec := json.NewDecoder(bytes.NewReader(std))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		se := &SnippetError{File: name, Msg: err.Error(), Err: err}
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			se.Line, se.Column = lineCol(std, int(syn.Offset))
		}
		return nil, se
	}
	m, ok := x.(map[string]any)
	if !ok {
		line, col := lineCol(std, v.StartOffset)
		return nil, &SnippetError{File: name, Line: line, Column: col, Msg: fmt.Sprintf("a snippet must be a JSON object ({...}), not %s", kindOf(x))}
	}
	return m, nil
}

// hujsonPosition splits "hujson: line L, column C: msg", the only form in
// which hujson reports where a syntax error is. Other messages come back
// whole with no position.
func hujsonPosition(msg string) (line, col int, rest string) {
	var l, c int
	if n, err := fmt.Sscanf(msg, "hujson: line %d, column %d:", &l, &c); err != nil || n != 2 || l < 1 || c < 1 {
		return 0, 0, msg
	}
	if _, after, ok := strings.Cut(msg, fmt.Sprintf("column %d: ", c)); ok {
		return l, c, after
	}
	return l, c, msg
}

// isEmptyJSONC reports whether data holds nothing but whitespace and
// comments; such a snippet counts as an empty object.
func isEmptyJSONC(data []byte) bool {
	if len(bytes.TrimSpace(data)) == 0 {
		return true
	}
	wrapped := make([]byte, 0, len(data)+3)
	wrapped = append(append(append(wrapped, '['), data...), "\n]"...)
	v, err := hujson.Parse(wrapped)
	if err != nil {
		return false
	}
	arr, ok := v.Value.(*hujson.Array)
	return ok && len(arr.Elements) == 0
}

// lineCol converts a byte offset into a 1-based line and byte column.
func lineCol(b []byte, off int) (int, int) {
	off = max(0, min(off, len(b)))
	line := 1 + bytes.Count(b[:off], []byte("\n"))
	col := 1 + off - (bytes.LastIndexByte(b[:off], '\n') + 1)
	return line, col
}

// merger merges parsed snippets and remembers which file set each key, to
// name both sides of a type disagreement.
type merger struct {
	root     map[string]any
	origins  originNode
	warnings []Warning
}

// originNode is the file that last set a key (empty: set by an ancestor's
// file) and the origins of keys below it.
type originNode struct {
	file string
	kids map[string]*originNode
}

// origin returns the file that set the value at keys: the nearest one
// recorded on the way down.
func (m *merger) origin(keys []string) string {
	found := "a lower snippet"
	n := &m.origins
	for _, k := range keys {
		if n = n.kids[k]; n == nil {
			break
		}
		if n.file != "" {
			found = n.file
		}
	}
	return found
}

// setOrigin records that file set the whole value at keys, forgetting what
// was recorded below it.
func (m *merger) setOrigin(keys []string, file string) {
	n := &m.origins
	for _, k := range keys {
		if n.kids == nil {
			n.kids = map[string]*originNode{}
		}
		c := n.kids[k]
		if c == nil {
			c = &originNode{}
			n.kids[k] = c
		}
		n = c
	}
	n.file, n.kids = file, nil
}

func (m *merger) merge(dst, src map[string]any, prefix []string, file string) {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := src[k]
		path := append(slices.Clip(prefix), k)
		if v == nil {
			if _, ok := dst[k]; ok {
				delete(dst, k)
				m.setOrigin(path, file)
			}
			continue
		}
		old, exists := dst[k]
		sm, srcIsMap := v.(map[string]any)
		dm, dstIsMap := old.(map[string]any)
		if srcIsMap && dstIsMap {
			m.merge(dm, sm, path, file)
			continue
		}
		if exists {
			if ok, nk := kindOf(old), kindOf(v); ok != nk {
				m.warnings = append(m.warnings, Warning{
					Source:  file,
					Key:     formatKey(path),
					Message: fmt.Sprintf("%s replaces the %s set by %s (the later snippet wins)", article(nk), ok, m.origin(path)),
				})
			}
		}
		if srcIsMap {
			v = dropNulls(sm)
		}
		dst[k] = v
		m.setOrigin(path, file)
	}
}

// dropNulls removes null members from an object and the objects inside it
// (not inside arrays): a null deletes, and there is nothing below to delete.
func dropNulls(m map[string]any) map[string]any {
	for k, v := range m {
		switch x := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			dropNulls(x)
		}
	}
	return m
}

func kindOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any, []map[string]any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number, int64, float64, int:
		return "number"
	case time.Time:
		return "datetime"
	default:
		return fmt.Sprintf("%T", x)
	}
}

func article(kind string) string {
	switch kind[0] {
	case 'a', 'e', 'i', 'o', 'u':
		return "an " + kind
	}
	return "a " + kind
}

func isBareKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '$') {
			return false
		}
	}
	return true
}

// formatKey writes a key path as dotted keys, quoting keys that are not bare.
func formatKey(keys []string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		if isBareKey(k) {
			parts[i] = k
		} else {
			parts[i] = strconv.Quote(k)
		}
	}
	return strings.Join(parts, ".")
}

func encode(root map[string]any, out Format, name string) ([]byte, error) {
	var buf bytes.Buffer
	switch out {
	case FormatJSON:
		v, err := forJSON(root, nil)
		if err != nil {
			return nil, &SnippetError{File: name, Msg: err.Error()}
		}
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return nil, &SnippetError{File: name, Msg: fmt.Sprintf("encode merged JSON: %v", err), Err: err}
		}
	case FormatTOML:
		v, err := forTOML(root, nil)
		if err != nil {
			return nil, &SnippetError{File: name, Msg: err.Error()}
		}
		enc := toml.NewEncoder(&buf)
		enc.Indent = ""
		if err := enc.Encode(v); err != nil {
			return nil, &SnippetError{File: name, Msg: fmt.Sprintf("encode merged TOML: %v", err), Err: err}
		}
	}
	return buf.Bytes(), nil
}

// forJSON checks that every value has a JSON form (TOML floats may be NaN or
// infinite) and turns TOML arrays of tables into plain arrays.
func forJSON(v any, keys []string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			n, err := forJSON(e, append(slices.Clip(keys), k))
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
		return x, nil
	case []any:
		for i, e := range x {
			n, err := forJSON(e, append(slices.Clip(keys), strconv.Itoa(i)))
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
		return x, nil
	case []map[string]any:
		a := make([]any, len(x))
		for i, e := range x {
			n, err := forJSON(e, append(slices.Clip(keys), strconv.Itoa(i)))
			if err != nil {
				return nil, err
			}
			a[i] = n
		}
		return a, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("key %s: %v has no JSON form", formatKey(keys), x)
		}
	}
	return v, nil
}

// forTOML turns JSON numbers into TOML integers or floats and rejects nulls
// left inside arrays, which TOML cannot hold.
func forTOML(v any, keys []string) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, fmt.Errorf("key %s: null has no TOML form", formatKey(keys))
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("key %s: number %s has no TOML form", formatKey(keys), x)
		}
		return f, nil
	case map[string]any:
		for k, e := range x {
			n, err := forTOML(e, append(slices.Clip(keys), k))
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
		return x, nil
	case []any:
		for i, e := range x {
			n, err := forTOML(e, append(slices.Clip(keys), strconv.Itoa(i)))
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
		return x, nil
	}
	return v, nil
}
