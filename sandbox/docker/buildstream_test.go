package docker

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// Aux payloads recorded from a Docker 20.10.24 engine building, with BuildKit,
//
//	FROM agents-sandbox-test/busybox:latest
//	RUN echo hello-from-build
//	RUN false
const (
	// A log of vertex sha256:ac64… ([2/3] RUN echo hello-from-build): "hello-from-build\n" on stdout.
	recordedBKLog = "GmsKR3NoYTI1NjphYzY0NWNhZDUxNjEyOTNlNzU5NjA0MTNjZWRiNDIyNWFiNjk2YTNhOWQ2NjdhOWIzYWM0NDkxZjRlMDg4YjJmEgsIkO2w2AYQvfOpLxgBIhFoZWxsby1mcm9tLWJ1aWxkCg=="
	// Vertex sha256:08c4… "[3/3] RUN false", started, completed, with an error.
	recordedBKFailedVertex = "CvgBCkdzaGEyNTY6MDhjNDM0OTkxNGFhYTQ1NTgxMWQyMzdhMTRkMDdjMzc1ZWNiNWVlNGY3ZWM4MWUyN2VkOGY0NjhjYmNhMWFhYhJHc2hhMjU2OmFjNjQ1Y2FkNTE2MTI5M2U3NTk2MDQxM2NlZGI0MjI1YWI2OTZhM2E5ZDY2N2E5YjNhYzQ0OTFmNGUwODhiMmYaD1szLzNdIFJVTiBmYWxzZSoLCJDtsNgGEL+x+jIyDAiQ7bDYBhCijt/LATo4ZXhlY3V0b3IgZmFpbGVkIHJ1bm5pbmcgWy9iaW4vc2ggLWMgZmFsc2VdOiBleGl0IGNvZGU6IDE="
)

func TestDecodeBuildKitStatusRecorded(t *testing.T) {
	raw, _ := base64.StdEncoding.DecodeString(recordedBKLog)
	st, err := decodeBuildKitStatus(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Logs) != 1 || string(st.Logs[0].Msg) != "hello-from-build\n" || st.Logs[0].Stream != 1 ||
		!strings.HasPrefix(st.Logs[0].Vertex, "sha256:ac645cad") {
		t.Errorf("log = %+v", st.Logs)
	}

	raw, _ = base64.StdEncoding.DecodeString(recordedBKFailedVertex)
	st, err = decodeBuildKitStatus(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := bkVertex{
		Digest: "sha256:08c4349914aaa455811d237a14d07c375ecb5ee4f7ec81e27ed8f468cbca1aab", Name: "[3/3] RUN false",
		Started: true, Completed: true, Error: "executor failed running [/bin/sh -c false]: exit code: 1",
	}
	if len(st.Vertexes) != 1 || st.Vertexes[0] != want {
		t.Errorf("vertexes = %+v, want %+v", st.Vertexes, want)
	}
}

func TestDecodeBuildKitStatusTruncated(t *testing.T) {
	raw, _ := base64.StdEncoding.DecodeString(recordedBKFailedVertex)
	for _, n := range []int{1, 2, 10, len(raw) - 1} {
		if _, err := decodeBuildKitStatus(raw[:n]); err == nil {
			t.Errorf("decoding %d of %d bytes: no error", n, len(raw))
		}
	}
}

// stream renders build response messages as the engine sends them.
func stream(msgs ...string) string { return strings.Join(msgs, "\r\n") + "\r\n" }

func streamText(s string) string { return fmt.Sprintf(`{"stream":%q}`, s) }

func TestBuildStreamClassic(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		wantID    string
		wantLines []string
		wantErr   []string // substrings of the error; nil: no error
	}{{
		name: "success, lines split across messages",
		body: stream(
			streamText("Step 1/2 : FROM busybox\n"), streamText(" ---> 1ad3e25dc095\n"),
			streamText("Step 2/2 : RUN echo hi\n"), streamText(" ---> Running in 63\n"),
			streamText("h"), streamText("i\nprogress 10%\rprogress 100%\n"),
			`{"aux":{"ID":"sha256:17188d2a"}}`, streamText("Successfully built 17188d2a\n"),
		),
		wantID: "sha256:17188d2a",
		wantLines: []string{
			"Step 1/2 : FROM busybox", " ---> 1ad3e25dc095", "Step 2/2 : RUN echo hi", " ---> Running in 63",
			"hi", "progress 100%", "Successfully built 17188d2a",
		},
	}, {
		name: "failure quotes the step and its output",
		body: stream(
			streamText("Step 1/3 : FROM busybox\n"), streamText(" ---> 1ad3e25dc095\n"),
			streamText("Step 2/3 : RUN make\n"), streamText(" ---> Running in 63\n"),
			streamText("compiling\nerror: boom\n"),
			`{"errorDetail":{"code":2,"message":"The command '/bin/sh -c make' returned a non-zero code: 2"},"error":"The command '/bin/sh -c make' returned a non-zero code: 2"}`,
		),
		wantErr: []string{`step "Step 2/3 : RUN make" failed: The command '/bin/sh -c make' returned a non-zero code: 2`, "last output:\n  compiling\n  error: boom"},
	}, {
		name:    "failure with no step (a bad Dockerfile)",
		body:    stream(`{"errorDetail":{"message":"dockerfile parse error line 1: unknown instruction: FORM"}}`),
		wantErr: []string{"image build failed: dockerfile parse error line 1: unknown instruction: FORM"},
	}, {
		name: "the last line without a newline is kept",
		body: stream(streamText("Step 1/1 : RUN x\n"), streamText("no newline"),
			`{"errorDetail":{"message":"failed"}}`),
		wantErr: []string{"last output:\n  no newline"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			s := newBuildStream(func(line string) { got = append(got, line) })
			if err := s.read(strings.NewReader(tc.body)); err != nil {
				t.Fatalf("read: %v", err)
			}
			if tc.wantLines != nil && strings.Join(got, "\n") != strings.Join(tc.wantLines, "\n") {
				t.Errorf("progress:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.wantLines, "\n"))
			}
			if s.imageID != tc.wantID {
				t.Errorf("image ID %q, want %q", s.imageID, tc.wantID)
			}
			err := s.err()
			if tc.wantErr == nil {
				if err != nil {
					t.Errorf("err = %v", err)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrBuildFailed) {
				t.Fatalf("err = %v, want ErrBuildFailed", err)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error:\n%s\nlacks:\n%s", err, w)
				}
			}
		})
	}
}

func TestBuildStreamTailIsCapped(t *testing.T) {
	msgs := []string{streamText("Step 1/1 : RUN noisy\n")}
	for i := range 50 {
		msgs = append(msgs, streamText(fmt.Sprintf("line %d\n", i)))
	}
	msgs = append(msgs, `{"errorDetail":{"message":"failed"}}`)
	s := newBuildStream(nil)
	if err := s.read(strings.NewReader(stream(msgs...))); err != nil {
		t.Fatal(err)
	}
	msg := s.err().Error()
	if strings.Contains(msg, "line 29\n") || !strings.Contains(msg, "line 30\n") || !strings.HasSuffix(msg, "line 49") {
		t.Errorf("want exactly the last %d lines:\n%s", tailLines, msg)
	}
}

func TestBuildStreamBuildKit(t *testing.T) {
	aux := func(b64 string) string { return fmt.Sprintf(`{"id":"moby.buildkit.trace","aux":%q}`, b64) }
	body := stream(
		aux(recordedBKLog),
		aux(recordedBKFailedVertex),
		`{"id":"moby.buildkit.trace","aux":"not base64!"}`, // lost progress, not a failure
		`{"errorDetail":{"message":"executor failed running [/bin/sh -c false]: exit code: 1"}}`,
	)
	var got []string
	s := newBuildStream(func(line string) { got = append(got, line) })
	if err := s.read(strings.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	want := []string{"#1 hello-from-build", "#2 [3/3] RUN false", "#2 ERROR: executor failed running [/bin/sh -c false]: exit code: 1"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("progress:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	err := s.err()
	if !errors.Is(err, sandbox.ErrBuildFailed) || !strings.Contains(err.Error(), `step "[3/3] RUN false" failed: executor failed`) {
		t.Errorf("err = %v", err)
	}
	if s.imageID != "" {
		t.Errorf("image ID %q from a trace message", s.imageID)
	}
}

func TestBuildStreamBrokenJSON(t *testing.T) {
	s := newBuildStream(nil)
	if err := s.read(strings.NewReader(stream(streamText("Step 1/1 : RUN x\n")) + `{"stream":`)); err == nil {
		t.Error("a truncated stream read without error")
	}
}
