package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/agents-sandbox/agents-sandbox/internal/testenv"
	"github.com/agents-sandbox/agents-sandbox/mcp"
	"github.com/agents-sandbox/agents-sandbox/tools"
)

// TestBuildFailedDocker: a project whose Dockerfile fails is -32003 with the
// failing step over JSON-RPC, and an isError result naming the fix over MCP.
func TestBuildFailedDocker(t *testing.T) {
	p := ownProject(t, fmt.Sprintf("FROM %s\nRUN echo about-to-fail-%d && exit 3\n", testenv.BaseImageRef, time.Now().UnixNano()))
	args := map[string]any{"checkout": p.dir}

	rc := newRPCClient(t, p.opts)
	var out tools.CreateOutput
	err := rc.call(context.Background(), "b", "sandbox_create", args, &out)
	je, ok := err.(*jsonrpc2.Error)
	if !ok || je.Code != int64(tools.CodeBuildFailed) {
		t.Fatalf("create with a failing Dockerfile: %v", err)
	}
	var d errData
	if je.Data == nil || json.Unmarshal(*je.Data, &d) != nil || d.Kind != "build_failed" {
		t.Errorf("data: %v", je.Data)
	}
	if !strings.Contains(je.Message, "exit 3") && !strings.Contains(je.Message, "about-to-fail") {
		t.Errorf("message does not quote the failing step: %s", je.Message)
	}

	mc := inProcessClient(t, p.opts)
	res := callTool(t, mc, "sandbox_create", args)
	if !res.IsError || !strings.Contains(resultText(res), "Dockerfile") {
		t.Errorf("MCP: %v %s", res.IsError, resultText(res))
	}
}

// TestBuildCancelDocker cancels a create while its image build runs a long
// step: the call ends promptly as cancelled and no image is left.
func TestBuildCancelDocker(t *testing.T) {
	p := ownProject(t, fmt.Sprintf("FROM %s\nRUN echo slow-step-%d && sleep 300\n", testenv.BaseImageRef, time.Now().UnixNano()))
	rc := newRPCClient(t, p.opts)
	done := make(chan error, 1)
	go func() {
		var out tools.CreateOutput
		done <- rc.call(context.Background(), "slow", "sandbox_create", map[string]any{"checkout": p.dir}, &out)
	}()
	waitFor(t, func() bool { return strings.Contains(rc.progressOf(`"slow"`), "slow-step") })
	start := time.Now()
	if err := rc.conn.Notify(context.Background(), mcp.MethodCancel, map[string]any{"id": "slow"}); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if je, ok := err.(*jsonrpc2.Error); !ok || je.Code != int64(tools.CodeCancelled) {
		t.Fatalf("cancelled build: %v", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the cancelled build took %s to stop", took)
	}
	var st tools.StatusOutput
	if err := rc.call(context.Background(), "st", "sandbox_status", map[string]any{"checkout": p.dir}, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != "missing" {
		t.Errorf("state after a cancelled create: %s", st.State)
	}
}

// TestConcurrentCallsDocker runs eight one-second commands at once over one
// JSON-RPC connection and one MCP client: they overlap instead of queueing.
func TestConcurrentCallsDocker(t *testing.T) {
	p := dockerProject(t)
	ensureCreated(t, p)
	const n = 8
	for _, fe := range frontEnds(t, p.opts) {
		t.Run(fe.name, func(t *testing.T) {
			start := time.Now()
			var wg sync.WaitGroup
			outs := make([]tools.ExecOutput, n)
			errs := make([]error, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = fe.try("sandbox_exec", map[string]any{"checkout": p.dir, "cmd": []string{"bash", "-c", fmt.Sprintf("sleep 1; echo %d", i)}}, &outs[i])
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			took := time.Since(start)
			for i, o := range outs {
				if o.Stdout.Text != fmt.Sprintf("%d\n", i) {
					t.Errorf("call %d: %+v", i, o)
				}
			}
			if took > n*time.Second {
				t.Errorf("%d one-second calls took %s: they ran one after another", n, took)
			}
		})
	}
}
