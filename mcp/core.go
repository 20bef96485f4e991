// Package mcp serves the tools of package tools over two front ends: MCP
// over stdio (mark3labs/mcp-go) and plain JSON-RPC 2.0 (sourcegraph/jsonrpc2)
// over stdio or a unix socket. Both only decode, validate against the tool's
// schema, call the same tools.Tool, encode and map errors; see docs/mcp.md
// for the wire contract (methods, notifications, error codes).
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agents-sandbox/agents-sandbox/tools"
)

// Options configure both front ends.
type Options struct {
	// Registry holds the tools to serve.
	Registry *tools.Registry
	// Schema returns a schema file's bytes by name
	// ("sandbox_exec.input.json"); schemas.Get in production.
	Schema func(name string) ([]byte, error)
	// Log receives the servers' logs. It must not write to the protocol
	// stream.
	Log zerolog.Logger
	// Version is the server version announced to MCP clients.
	Version string
	// ProgressInterval is the minimum time between two progress
	// notifications of one call (default 100 ms: at most 10 a second);
	// reports in between are coalesced, never dropped.
	ProgressInterval time.Duration
	// Workers is how many MCP tool calls run at once (default 64); further
	// calls queue. JSON-RPC calls are not limited.
	Workers int
}

// MaxMessageBytes is the largest JSON-RPC message (one line) the JSON-RPC
// front end accepts: 16 MiB. Longer lines are answered with an error and
// skipped without being buffered.
const MaxMessageBytes = 16 << 20

// served is one tool with its schemas, ready to call.
type served struct {
	tool      tools.Tool
	inRaw     json.RawMessage
	outRaw    json.RawMessage
	inSchema  *jsonschema.Schema
	outSchema *jsonschema.Schema
}

// dispatcher is what both front ends share: the tools with their compiled
// schemas, input validation and error mapping.
type dispatcher struct {
	opts   Options
	log    zerolog.Logger
	tools  []*served
	byName map[string]*served
	// pw is the MCP stdio output when serving stdio (see progressWriter).
	pw *progressWriter
}

func newDispatcher(o Options) (*dispatcher, error) {
	if o.Registry == nil {
		return nil, errors.New("mcp: no tool registry")
	}
	if o.Schema == nil {
		return nil, errors.New("mcp: no schema source")
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 100 * time.Millisecond
	}
	if o.Workers <= 0 {
		o.Workers = 64
	}
	d := &dispatcher{opts: o, log: o.Log, byName: map[string]*served{}}
	for _, t := range o.Registry.Tools() {
		s := &served{tool: t}
		var err error
		if s.inRaw, s.inSchema, err = compileSchema(o.Schema, t.InputSchema); err != nil {
			return nil, fmt.Errorf("tool %s: %w", t.Name, err)
		}
		if s.outRaw, s.outSchema, err = compileSchema(o.Schema, t.OutputSchema); err != nil {
			return nil, fmt.Errorf("tool %s: %w", t.Name, err)
		}
		d.tools = append(d.tools, s)
		d.byName[t.Name] = s
	}
	sort.Slice(d.tools, func(i, j int) bool { return d.tools[i].tool.Name < d.tools[j].tool.Name })
	return d, nil
}

// CompileSchema compiles one schema document (draft 2020-12 unless it says
// otherwise). It refuses references to other documents: every schema is
// self-contained.
func CompileSchema(name string, raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema %s: %w", name, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	url := "mem:///" + name
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("schema %s: %w", name, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("compile schema %s: %w", name, err)
	}
	return s, nil
}

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schemas must be self-contained: reference to %s", url)
}

func compileSchema(get func(string) ([]byte, error), name string) (json.RawMessage, *jsonschema.Schema, error) {
	raw, err := get(name)
	if err != nil {
		return nil, nil, fmt.Errorf("load schema %s: %w", name, err)
	}
	s, err := CompileSchema(name, raw)
	if err != nil {
		return nil, nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, nil, fmt.Errorf("schema %s: %w", name, err)
	}
	return json.RawMessage(compact.Bytes()), s, nil
}

// validate checks args (a JSON value; empty means {}) against the tool's
// input schema. The error lists every problem with its JSON pointer.
func (s *served) validate(args json.RawMessage) *tools.Error {
	if t := bytes.TrimSpace(args); len(t) == 0 || string(t) == "null" {
		args = json.RawMessage("{}")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return tools.InvalidParams(s.tool.Name, "", "the arguments are not valid JSON: %v", err)
	}
	verr := s.inSchema.Validate(inst)
	if verr == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(verr, &ve) {
		return tools.InvalidParams(s.tool.Name, "", "invalid arguments: %v", verr)
	}
	probs := problems(ve)
	e := tools.InvalidParams(s.tool.Name, probs[0].Pointer, "%s", describe(s.tool.Name, probs))
	e.Problems = probs
	e.Err = verr
	return e
}

// problems flattens a validation error into its leaf problems, sorted by
// pointer.
func problems(ve *jsonschema.ValidationError) []tools.Problem {
	out := ve.BasicOutput()
	var ps []tools.Problem
	seen := map[string]bool{}
	var walk func(u jsonschema.OutputUnit)
	walk = func(u jsonschema.OutputUnit) {
		if u.Error != nil && len(u.Errors) == 0 {
			msg := u.Error.String()
			if !seen[u.InstanceLocation+"\x00"+msg] {
				seen[u.InstanceLocation+"\x00"+msg] = true
				ps = append(ps, tools.Problem{Pointer: u.InstanceLocation, Message: msg})
			}
		}
		for _, c := range u.Errors {
			walk(c)
		}
	}
	walk(*out)
	if len(ps) == 0 {
		ps = []tools.Problem{{Pointer: "", Message: ve.Error()}}
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Pointer < ps[j].Pointer })
	return ps
}

func describe(tool string, ps []tools.Problem) string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid arguments for %s: ", tool)
	for i, p := range ps {
		if i > 0 {
			b.WriteString("; ")
		}
		ptr := p.Pointer
		if ptr == "" {
			ptr = "(the arguments object)"
		}
		fmt.Fprintf(&b, "%s: %s", ptr, p.Message)
	}
	b.WriteString(" (see the tool's input schema)")
	return b.String()
}

// call validates args and runs the tool. A cancelled ctx always yields a
// CodeCancelled error, whatever the tool returned.
func (d *dispatcher) call(ctx context.Context, s *served, args json.RawMessage, progress func(tools.Progress)) (tools.Result, *tools.Error) {
	if terr := s.validate(args); terr != nil {
		return tools.Result{}, terr
	}
	start := time.Now()
	res, err := s.tool.Call(ctx, tools.Call{Progress: progress}, args)
	d.log.Debug().Str("tool", s.tool.Name).Dur("took", time.Since(start)).Err(err).Msg("tool call")
	if ctx.Err() != nil {
		return tools.Result{}, &tools.Error{Code: tools.CodeCancelled, Kind: tools.KindCancelled, Tool: s.tool.Name, Message: s.tool.Name + ": cancelled by the caller", Err: ctx.Err()}
	}
	if err != nil {
		var terr *tools.Error
		if !errors.As(err, &terr) {
			terr = &tools.Error{Code: tools.CodeInternal, Kind: tools.KindInternal, Tool: s.tool.Name, Message: err.Error(), Err: err}
		}
		if terr.Code == tools.CodeInternal {
			d.log.Error().Err(err).Str("tool", s.tool.Name).Msg("tool failed")
		}
		return tools.Result{}, terr
	}
	return res, nil
}

// toolDescriptor is a tool as tools/list shows it (both front ends).
type toolDescriptor struct {
	Name         string          `json:"name"`
	Title        string          `json:"title,omitempty"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"inputSchema"`
	OutputSchema json.RawMessage `json:"outputSchema"`
	Annotations  annotations     `json:"annotations"`
}

type annotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    bool   `json:"readOnlyHint"`
	DestructiveHint bool   `json:"destructiveHint"`
	IdempotentHint  bool   `json:"idempotentHint"`
	OpenWorldHint   bool   `json:"openWorldHint"`
}

func (s *served) descriptor() toolDescriptor {
	h := s.tool.Hints
	return toolDescriptor{Name: s.tool.Name, Title: s.tool.Title, Description: s.tool.Description, InputSchema: s.inRaw, OutputSchema: s.outRaw,
		Annotations: annotations{Title: s.tool.Title, ReadOnlyHint: h.ReadOnly.Bool(), DestructiveHint: h.Destructive.Bool(), IdempotentHint: h.Idempotent.Bool(), OpenWorldHint: h.OpenWorld.Bool()}}
}
