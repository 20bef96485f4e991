package tools

import (
	"context"
	"errors"
	"fmt"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// Code is the JSON-RPC error code of a tool failure. The standard codes are
// used where they fit; the domain errors use the small range -32001..-32007,
// and a cancelled call is -32800 (as in LSP).
type Code int

// Error codes. They are part of the JSON-RPC interface (docs/mcp.md).
const (
	CodeInvalidParams      Code = -32602 // an argument is invalid; Data.pointer names it
	CodeInternal           Code = -32603 // a bug or an unexpected failure
	CodeNotFound           Code = -32001 // the checkout, VM or sandbox does not exist
	CodeRuntimeUnavailable Code = -32002 // the container engine does not answer
	CodeBuildFailed        Code = -32003 // the image build failed
	CodeConflict           Code = -32004 // a name is taken, or the state forbids the operation
	CodeInvalidConfig      Code = -32005 // the project's configuration is invalid
	CodeUnsupported        Code = -32006 // the operation is not available in this build
	CodeUntrusted          Code = -32007 // the checkout's configuration needs the user's trust first
	CodeCancelled          Code = -32800 // the caller cancelled the call
)

// Kind is the machine-readable name of a Code, carried in the error data.
const (
	KindInvalidParams      = "invalid_params"
	KindInternal           = "internal"
	KindNotFound           = "not_found"
	KindRuntimeUnavailable = "runtime_unavailable"
	KindBuildFailed        = "build_failed"
	KindConflict           = "conflict"
	KindInvalidConfig      = "invalid_config"
	KindUnsupported        = "unsupported"
	KindUntrusted          = "untrusted"
	KindCancelled          = "cancelled"
)

// Error is a tool failure the caller can act on. Message says what went
// wrong and how to fix it. Front ends send it as an MCP result with isError
// (Message as its text) or as a JSON-RPC error (Code, Message, Data()).
type Error struct {
	Code    Code
	Kind    string
	Tool    string
	Message string
	// Pointer is the JSON pointer (RFC 6901) of the offending argument for
	// CodeInvalidParams ("/checkout", "/env/2"); "" is the whole input.
	Pointer string
	// Problems lists every schema violation when there are several.
	Problems []Problem
	Err      error
}

// Problem is one invalid argument.
type Problem struct {
	Pointer string `json:"pointer"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// ErrorData is the JSON-RPC error's data object.
type ErrorData struct {
	Kind     string    `json:"kind"`
	Tool     string    `json:"tool,omitempty"`
	Pointer  *string   `json:"pointer,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
}

// Data returns the JSON-RPC error data object.
func (e *Error) Data() ErrorData {
	d := ErrorData{Kind: e.Kind, Tool: e.Tool, Problems: e.Problems}
	if e.Code == CodeInvalidParams {
		p := e.Pointer
		d.Pointer = &p
	}
	return d
}

// InvalidParams returns an invalid-argument error for the argument at pointer.
func InvalidParams(tool, pointer, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidParams, Kind: KindInvalidParams, Tool: tool, Pointer: pointer, Message: fmt.Sprintf(format, args...)}
}

// asError maps any handler error to an *Error: sentinel errors of package
// sandbox to their codes, a cancelled context to CodeCancelled, the rest to
// CodeInternal. The message keeps the core's text (which names the object
// and the fix) and adds a hint where the core's text does not say what to do.
func asError(ctx context.Context, tool string, err error) *Error {
	var te *Error
	if errors.As(err, &te) {
		if te.Tool == "" {
			te.Tool = tool
		}
		return te
	}
	e := &Error{Tool: tool, Message: err.Error(), Err: err}
	switch {
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctx.Err())):
		e.Code, e.Kind = CodeCancelled, KindCancelled
		e.Message = tool + ": cancelled by the caller"
	case errors.Is(err, sandbox.ErrRuntimeUnavailable):
		e.Code, e.Kind = CodeRuntimeUnavailable, KindRuntimeUnavailable
		e.Message += "; start the Docker engine (or point DOCKER_HOST at one) and call " + tool + " again"
	case errors.Is(err, sandbox.ErrBuildFailed):
		e.Code, e.Kind = CodeBuildFailed, KindBuildFailed
		e.Message += "; fix .agents-sandbox/Dockerfile, the agent's install step or image.base in the project's config, then call sandbox_create again (with rebuild: true to build from scratch)"
	case errors.Is(err, sandbox.ErrUntrusted):
		e.Code, e.Kind = CodeUntrusted, KindUntrusted
	case errors.Is(err, sandbox.ErrNotFound):
		e.Code, e.Kind = CodeNotFound, KindNotFound
	case errors.Is(err, sandbox.ErrConflict):
		e.Code, e.Kind = CodeConflict, KindConflict
	case errors.Is(err, sandbox.ErrInvalid):
		e.Code, e.Kind = CodeInvalidConfig, KindInvalidConfig
	default:
		e.Code, e.Kind = CodeInternal, KindInternal
	}
	return e
}
