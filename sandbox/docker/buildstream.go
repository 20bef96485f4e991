package docker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/moby/moby/api/types/jsonstream"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

// tailLines is how many output lines a build failure quotes.
const tailLines = 20

const buildKitTraceID = "moby.buildkit.trace"

var classicStep = regexp.MustCompile(`^Step \d+/\d+ : `)

// buildStream turns the engine's build response stream (the classic
// builder's text and BuildKit's trace messages alike) into progress lines,
// the built image's ID, and on failure an error that quotes the failing step
// and the last lines of its output.
type buildStream struct {
	progress sandbox.ProgressFunc

	imageID string
	errMsg  string // the stream's errorDetail, "" while the build goes well

	// Classic builder.
	partial string   // stream text after the last newline
	step    string   // the current "Step n/m : …" line
	tail    []string // output lines since step began (or since the start)

	// BuildKit.
	vertexes map[string]*bkVertexState
	seq      int
	failed   *bkVertexState
}

type bkVertexState struct {
	n                                 int
	name                              string
	announced, cached, done, errShown bool
	partial                           string
	tail                              []string
}

func newBuildStream(progress sandbox.ProgressFunc) *buildStream {
	return &buildStream{progress: progress, vertexes: map[string]*bkVertexState{}}
}

// read consumes the whole stream. It returns an error only when the stream
// itself cannot be read or decoded; a failed build is reported by err().
func (s *buildStream) read(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var msg jsonstream.Message
		if err := dec.Decode(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				s.flush()
				return nil
			}
			s.flush()
			return err
		}
		s.handle(msg)
	}
}

func (s *buildStream) handle(msg jsonstream.Message) {
	switch {
	case msg.Aux != nil && msg.ID == buildKitTraceID:
		var raw []byte // the aux value is a JSON string holding base64
		if err := json.Unmarshal(*msg.Aux, &raw); err != nil {
			return // an aux we cannot read is only lost progress
		}
		st, err := decodeBuildKitStatus(raw)
		if err != nil {
			return
		}
		s.handleBuildKit(st)
	case msg.Aux != nil:
		var aux struct{ ID string }
		if json.Unmarshal(*msg.Aux, &aux) == nil && aux.ID != "" {
			s.imageID = aux.ID
		}
	}
	if msg.Stream != "" {
		s.text(msg.Stream)
	}
	if msg.Status != "" && msg.Progress == nil {
		line := msg.Status
		if msg.ID != "" {
			line = msg.ID + ": " + line
		}
		s.emit(line)
	}
	if msg.Error != nil && msg.Error.Message != "" && s.errMsg == "" {
		s.errMsg = strings.TrimSpace(msg.Error.Message)
	}
}

// text handles classic builder output, which arrives in arbitrary chunks.
func (s *buildStream) text(chunk string) {
	data := s.partial + chunk
	lines := strings.Split(data, "\n")
	s.partial = lines[len(lines)-1]
	for _, line := range lines[:len(lines)-1] {
		line = terminalLine(line)
		if classicStep.MatchString(line) {
			s.step = line
			s.tail = s.tail[:0]
			s.emit(line)
			continue
		}
		s.emit(line)
		if !classicNoise(line) {
			s.tail = appendTail(s.tail, line)
		}
	}
}

// classicNoise tells the classic builder's own bookkeeping lines apart from
// the output of a step.
func classicNoise(line string) bool {
	return strings.HasPrefix(line, " ---> ") || strings.HasPrefix(line, "Removing intermediate container ")
}

func (s *buildStream) flush() {
	if s.partial != "" {
		line := terminalLine(s.partial)
		s.partial = ""
		s.emit(line)
		s.tail = appendTail(s.tail, line)
	}
	for _, v := range s.vertexes {
		if v.partial != "" {
			line := terminalLine(v.partial)
			v.partial = ""
			s.emit(fmt.Sprintf("#%d %s", v.n, line))
			v.tail = appendTail(v.tail, line)
		}
	}
}

func (s *buildStream) handleBuildKit(st bkStatus) {
	for _, in := range st.Vertexes {
		v := s.vertex(in.Digest)
		if in.Name != "" {
			v.name = in.Name
		}
		if (in.Started || in.Cached || in.Completed) && !v.announced {
			v.announced = true
			s.emit(fmt.Sprintf("#%d %s", v.n, v.name))
		}
		if in.Cached && !v.cached {
			v.cached = true
			s.emit(fmt.Sprintf("#%d CACHED", v.n))
		}
		if in.Error != "" && !v.errShown {
			v.errShown = true
			s.emit(fmt.Sprintf("#%d ERROR: %s", v.n, in.Error))
			if s.failed == nil {
				s.failed = v
			}
		} else if in.Completed && in.Error == "" && !in.Cached && !v.done {
			v.done = true
			s.emit(fmt.Sprintf("#%d DONE", v.n))
		}
	}
	for _, l := range st.Logs {
		v := s.vertex(l.Vertex)
		data := v.partial + string(l.Msg)
		lines := strings.Split(data, "\n")
		v.partial = lines[len(lines)-1]
		for _, line := range lines[:len(lines)-1] {
			line = terminalLine(line)
			s.emit(fmt.Sprintf("#%d %s", v.n, line))
			v.tail = appendTail(v.tail, line)
			s.tail = appendTail(s.tail, line)
		}
	}
	for _, w := range st.Warnings {
		s.emit("WARNING: " + strings.TrimSpace(w.Short))
	}
}

func (s *buildStream) vertex(digest string) *bkVertexState {
	v, ok := s.vertexes[digest]
	if !ok {
		s.seq++
		v = &bkVertexState{n: s.seq}
		s.vertexes[digest] = v
	}
	return v
}

func (s *buildStream) emit(line string) {
	if s.progress != nil {
		s.progress(line)
	}
}

// err returns the build failure, wrapping sandbox.ErrBuildFailed, or nil.
func (s *buildStream) err() error {
	if s.errMsg == "" {
		return nil
	}
	step, tail := s.step, s.tail
	if s.failed != nil {
		step, tail = s.failed.name, s.failed.tail
		if len(tail) == 0 {
			tail = s.tail
		}
	}
	var b strings.Builder
	if step != "" {
		fmt.Fprintf(&b, "step %q failed: ", step)
	}
	b.WriteString(s.errMsg)
	if len(tail) > 0 {
		b.WriteString("\nlast output:")
		for _, line := range tail {
			b.WriteString("\n  ")
			b.WriteString(line)
		}
	}
	return fmt.Errorf("%w: %s", sandbox.ErrBuildFailed, b.String())
}

// terminalLine keeps what a terminal would show of a line with carriage
// returns (progress bars redraw themselves with \r).
func terminalLine(line string) string {
	line = strings.TrimRight(line, "\r")
	if i := strings.LastIndexByte(line, '\r'); i >= 0 {
		line = line[i+1:]
	}
	return line
}

func appendTail(tail []string, line string) []string {
	if strings.TrimSpace(line) == "" {
		return tail
	}
	if len(tail) == tailLines {
		copy(tail, tail[1:])
		tail = tail[:tailLines-1]
	}
	return append(tail, line)
}
