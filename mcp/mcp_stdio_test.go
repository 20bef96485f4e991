package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/mcp"
)

// TestServeMCPOversizedLine: over stdio, a message over 16 MiB gets a parse
// error without being held in memory, and the server keeps serving. This is
// the only test in the package that runs ServeMCP (mcp-go's stdio session
// is process-wide).
func TestServeMCPOversizedLine(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mcp.ServeMCP(ctx, deadEngineOptions(t), inR, outW); outW.Close() }()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	go func() {
		init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n"
		_, _ = io.WriteString(inW, init)
		_, _ = io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
		// A 64 MiB line, written in pieces.
		piece := strings.Repeat("x", 1<<20)
		_, _ = io.WriteString(inW, `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"pad":"`)
		for i := 0; i < 64; i++ {
			_, _ = io.WriteString(inW, piece)
		}
		_, _ = io.WriteString(inW, "\"}}\n")
		_, _ = io.WriteString(inW, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`+"\n")
	}()

	sc := bufio.NewScanner(outR)
	sc.Buffer(nil, 4<<20)
	var sawParseError, sawList bool
	for !(sawParseError && sawList) && sc.Scan() {
		var m struct {
			ID     json.RawMessage     `json:"id"`
			Error  *struct{ Code int } `json:"error"`
			Result json.RawMessage     `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("stdout line not JSON: %q", sc.Text())
		}
		if m.Error != nil && m.Error.Code == -32700 {
			sawParseError = true
		}
		if string(m.ID) == "3" && m.Result != nil {
			sawList = true
		}
	}
	if !sawParseError || !sawList {
		t.Fatalf("parse error for the oversized line %v, answer to the next request %v", sawParseError, sawList)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 48<<20 {
		t.Errorf("heap in use grew by %d MiB while skipping a 64 MiB line", grew>>20)
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Errorf("ServeMCP: %v", err)
	}
}
