package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"

	"github.com/sourcegraph/jsonrpc2"
)

// JSON-RPC 2.0 protocol error codes used by the framing layer.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
)

// lineStream is a jsonrpc2.ObjectStream over newline-delimited JSON that
// keeps serving after bad input: a line that is not JSON is answered with
// -32700, a JSON line that is not a request or response with -32600, a
// batch with -32600, and a line longer than maxLine with -32600 after
// skipping it in constant memory. Only valid messages reach jsonrpc2.
type lineStream struct {
	r       *bufio.Reader
	w       io.Writer
	c       io.Closer
	maxLine int
	onBad   func(code int, msg string)

	wmu sync.Mutex
}

func newLineStream(rw io.ReadWriteCloser, maxLine int, onBad func(code int, msg string)) *lineStream {
	return &lineStream{r: bufio.NewReaderSize(rw, 64<<10), w: rw, c: rw, maxLine: maxLine, onBad: onBad}
}

// errTooLong marks a line over the limit (it has been skipped).
var errTooLong = errors.New("line too long")

// readLine returns the next line without its newline. A line longer than
// maxLine is consumed and errTooLong returned; memory stays bounded.
func (s *lineStream) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(buf)+len(chunk) > s.maxLine+1 { // +1: the newline itself
			// Skip to the end of the line without keeping it.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = s.r.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, errTooLong
		}
		if need := len(buf) + len(chunk); need > cap(buf) {
			// Grow by doubling (append grows large slices by 1.25x, which
			// allocates several times the line's size on the way up).
			nb := make([]byte, len(buf), max(2*cap(buf), need, 4096))
			copy(nb, buf)
			buf = nb
		}
		buf = append(buf, chunk...)
		switch {
		case err == nil:
			return bytes.TrimRight(buf, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(bytes.TrimSpace(buf)) > 0:
			return buf, nil // a last line without newline
		default:
			return nil, err
		}
	}
}

// ReadObject implements jsonrpc2.ObjectStream.
func (s *lineStream) ReadObject(v any) error {
	for {
		line, err := s.readLine()
		if errors.Is(err, errTooLong) {
			s.replyError(nil, codeInvalidRequest, fmt.Sprintf("message larger than %d bytes rejected", s.maxLine), map[string]any{"kind": "too_large", "limit": s.maxLine})
			continue
		}
		if err != nil {
			return err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if !json.Valid(line) {
			s.replyError(nil, codeParseError, "parse error: the line is not valid JSON", map[string]any{"kind": "parse_error"})
			continue
		}
		if line[0] == '[' {
			s.replyError(nil, codeInvalidRequest, "batch requests are not supported: send one request per line", map[string]any{"kind": "invalid_request"})
			continue
		}
		if line[0] != '{' {
			s.replyError(nil, codeInvalidRequest, "invalid request: a message must be a JSON object", map[string]any{"kind": "invalid_request"})
			continue
		}
		fresh := reflect.New(reflect.TypeOf(v).Elem())
		if err := json.Unmarshal(line, fresh.Interface()); err != nil {
			s.replyError(requestID(line), codeInvalidRequest, "invalid request: "+err.Error(), map[string]any{"kind": "invalid_request"})
			continue
		}
		if vv := probeVersion(line); vv != "2.0" {
			s.replyError(requestID(line), codeInvalidRequest, `invalid request: "jsonrpc" must be "2.0"`, map[string]any{"kind": "invalid_request"})
			continue
		}
		reflect.ValueOf(v).Elem().Set(fresh.Elem())
		return nil
	}
}

// requestID extracts a usable id (string or integer) from a message, or nil.
func requestID(line []byte) any {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(line, &m) != nil || len(m.ID) == 0 {
		return nil
	}
	var s string
	if json.Unmarshal(m.ID, &s) == nil {
		return s
	}
	var n int64
	if json.Unmarshal(m.ID, &n) == nil {
		return n
	}
	return nil
}

func probeVersion(line []byte) string {
	var m struct {
		V string `json:"jsonrpc"`
	}
	_ = json.Unmarshal(line, &m)
	return m.V
}

type wireError struct {
	JSONRPC string     `json:"jsonrpc"`
	ID      any        `json:"id"`
	Error   wireDetail `json:"error"`
}

type wireDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (s *lineStream) replyError(id any, code int, msg string, data any) {
	if s.onBad != nil {
		s.onBad(code, msg)
	}
	_ = s.WriteObject(wireError{JSONRPC: "2.0", ID: id, Error: wireDetail{Code: code, Message: msg, Data: data}})
}

// WriteObject implements jsonrpc2.ObjectStream: one JSON object per line.
func (s *lineStream) WriteObject(obj any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err = s.w.Write(b)
	return err
}

// Close implements jsonrpc2.ObjectStream.
func (s *lineStream) Close() error { return s.c.Close() }

var _ jsonrpc2.ObjectStream = (*lineStream)(nil)
