// Package tools holds the operations of agents-sandbox as data: each tool is
// a record (name, description, schema names, behaviour hints) with a typed
// handler that takes an input struct and returns an output struct. Both
// front ends in package mcp (MCP and plain JSON-RPC 2.0) serve the same
// Registry; this package imports neither transport.
package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
)

// Hint is an explicit yes/no for one of a tool's behaviour hints. The zero
// value is unset, which a test forbids: every tool says every hint.
type Hint int8

// Hint values.
const (
	HintUnset Hint = iota
	Yes
	No
)

// Bool reports whether the hint is Yes. It panics on HintUnset, which the
// registry test rules out.
func (h Hint) Bool() bool {
	switch h {
	case Yes:
		return true
	case No:
		return false
	}
	panic("tools: hint not set")
}

// Hints describe how a tool behaves, as MCP tool annotations do.
type Hints struct {
	// ReadOnly: the tool changes nothing.
	ReadOnly Hint
	// Destructive: the tool may delete or overwrite something (a VM, a
	// volume, a file in the VM, a secret).
	Destructive Hint
	// Idempotent: calling it again with the same input has no further effect.
	Idempotent Hint
	// OpenWorld: the tool reaches outside the local machine (builds that
	// fetch packages, commands that use the network).
	OpenWorld Hint
}

// Progress is one progress report of a running tool.
type Progress struct {
	// Current counts the progress reports of this call so far; it only grows.
	Current float64
	// Total is the expected final Current, 0 when unknown.
	Total float64
	// Message is a human-readable line (a build step, output of a command).
	Message string
}

// Call carries what a front end gives one tool call besides its input.
type Call struct {
	// Progress receives progress reports. It may be nil; handlers never see
	// nil (Tool.Call replaces it with a no-op). It must not block for long:
	// front ends coalesce and throttle.
	Progress func(Progress)
}

// Result is a tool's successful outcome: the structured output (marshals to
// JSON matching the tool's output schema) and a short human-readable text.
type Result struct {
	Structured any
	Text       string
}

// Tool is one operation as data.
type Tool struct {
	// Name is the tool's name, also the JSON-RPC method ("sandbox_exec").
	Name string
	// Title is a short human-readable name ("Run a command in the sandbox").
	Title string
	// Description tells a model when and how to use the tool.
	Description string
	// InputSchema and OutputSchema name the schema files in package schemas
	// ("sandbox_exec.input.json").
	InputSchema, OutputSchema string
	Hints                     Hints

	in, out reflect.Type
	run     func(ctx context.Context, c Call, in any) (any, string, error)
}

// InputType and OutputType are the Go types the tool's input is decoded into
// and its output is encoded from (for schema checks).
func (t Tool) InputType() reflect.Type  { return t.in }
func (t Tool) OutputType() reflect.Type { return t.out }

// Call decodes raw (a JSON object; empty means {}) into the tool's input type,
// strictly (unknown fields are errors), and runs the handler. Front ends
// validate raw against the input schema first. Errors are always *Error.
func (t Tool) Call(ctx context.Context, c Call, raw json.RawMessage) (Result, error) {
	if c.Progress == nil {
		c.Progress = func(Progress) {}
	}
	in := reflect.New(t.in)
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(in.Interface()); err != nil {
		return Result{}, decodeError(t.Name, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Result{}, &Error{Code: CodeInvalidParams, Kind: KindInvalidParams, Tool: t.Name, Pointer: "", Message: "the arguments must be one JSON object"}
	}
	ctx, warnings := withWarnings(ctx)
	out, text, err := t.run(ctx, c, in.Interface())
	if err != nil {
		return Result{}, asError(ctx, t.Name, err)
	}
	for i := len(*warnings) - 1; i >= 0; i-- {
		text = "warning: " + (*warnings)[i] + "\n" + text
	}
	return Result{Structured: out, Text: text}, nil
}

// define makes a Tool from a typed handler.
func define[I, O any](t Tool, h func(ctx context.Context, c Call, in *I) (O, string, error)) Tool {
	t.in = reflect.TypeFor[I]()
	t.out = reflect.TypeFor[O]()
	t.run = func(ctx context.Context, c Call, in any) (any, string, error) {
		out, text, err := h(ctx, c, in.(*I))
		if err != nil {
			return nil, "", err
		}
		return out, text, nil
	}
	return t
}

// decodeError turns a json decoding error into invalid params naming the field.
func decodeError(tool string, err error) *Error {
	e := &Error{Code: CodeInvalidParams, Kind: KindInvalidParams, Tool: tool, Message: "invalid arguments: " + err.Error(), Err: err}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		e.Pointer = "/" + jsonPointerFromDotted(te.Field)
		e.Message = fmt.Sprintf("argument %s: must be %s, not a JSON %s", e.Pointer, te.Type.String(), te.Value)
	}
	return e
}

func jsonPointerFromDotted(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '.':
			b.WriteByte('/')
		case '~':
			b.WriteString("~0")
		case '/':
			b.WriteString("~1")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Registry is the set of tools a server offers.
type Registry struct {
	tools  []Tool
	byName map[string]int
}

// NewRegistry returns a registry of the given tools, sorted by name. It
// panics on a duplicate name (a programming error).
func NewRegistry(ts ...Tool) *Registry {
	r := &Registry{byName: map[string]int{}}
	r.tools = append(r.tools, ts...)
	sort.Slice(r.tools, func(i, j int) bool { return r.tools[i].Name < r.tools[j].Name })
	for i, t := range r.tools {
		if _, dup := r.byName[t.Name]; dup {
			panic("tools: duplicate tool " + t.Name)
		}
		r.byName[t.Name] = i
	}
	return r
}

// Tools returns every tool, sorted by name.
func (r *Registry) Tools() []Tool { return append([]Tool(nil), r.tools...) }

// Lookup returns the tool with that name.
func (r *Registry) Lookup(name string) (Tool, bool) {
	i, ok := r.byName[name]
	if !ok {
		return Tool{}, false
	}
	return r.tools[i], true
}
