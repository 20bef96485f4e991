package mcp

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

type fakeConn struct {
	io.Reader
	out bytes.Buffer
}

func (c *fakeConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c *fakeConn) Close() error                { return nil }

// FuzzLineStream feeds arbitrary bytes to the framing layer: it never
// panics, every message it hands on is a JSON object, and everything it
// writes back is one JSON-RPC error object per line.
func FuzzLineStream(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}` + "\n",
		"not json\n{}\n[1,2]\n",
		`{"jsonrpc":"2.0","id":1.5,"method":"x"}` + "\n",
		`{"jsonrpc":"1.0","id":"a","method":"x"}` + "\r\n\n\n",
		`{"jsonrpc":"2.0","id":{"a":1},"method":"x"}`,
		"\x00\xff{",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &fakeConn{Reader: bytes.NewReader(data)}
		s := newLineStream(c, 1024, nil)
		for i := 0; i < 1000; i++ {
			var m json.RawMessage
			if err := s.ReadObject(&m); err != nil {
				break
			}
			if !json.Valid(m) || len(m) == 0 || m[0] != '{' {
				t.Fatalf("handed on %q", m)
			}
		}
		for _, line := range bytes.Split(bytes.TrimSuffix(c.out.Bytes(), []byte("\n")), []byte("\n")) {
			if len(line) == 0 && c.out.Len() == 0 {
				continue
			}
			var e struct {
				JSONRPC string `json:"jsonrpc"`
				Error   *struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(line, &e); err != nil || e.JSONRPC != "2.0" || e.Error == nil {
				t.Fatalf("wrote %q", line)
			}
		}
	})
}
