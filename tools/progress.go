package tools

import (
	"bytes"
	"strings"
	"sync"
)

// reporter numbers the progress reports of one call and turns output
// streams into line-sized reports.
type reporter struct {
	mu   sync.Mutex
	n    float64
	send func(Progress)
}

func newReporter(c Call) *reporter { return &reporter{send: c.Progress} }

// line reports one message.
func (r *reporter) line(msg string) {
	msg = strings.TrimRight(msg, "\r\n")
	if msg == "" {
		return
	}
	r.mu.Lock()
	r.n++
	p := Progress{Current: r.n, Message: msg}
	r.mu.Unlock()
	r.send(p)
}

// writer returns an io.Writer that reports each complete line written to it,
// prefixed ("stdout: "). Lines longer than 4 KiB are reported in pieces.
// Call flush when the stream ends.
func (r *reporter) writer(prefix string) *lineWriter {
	return &lineWriter{r: r, prefix: prefix}
}

type lineWriter struct {
	mu     sync.Mutex
	r      *reporter
	prefix string
	buf    bytes.Buffer
}

const maxProgressLine = 4 << 10

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		b := w.buf.Bytes()
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(b) >= maxProgressLine {
				w.r.line(w.prefix + string(b[:maxProgressLine]))
				w.buf.Next(maxProgressLine)
				continue
			}
			return len(p), nil
		}
		w.r.line(w.prefix + string(b[:i]))
		w.buf.Next(i + 1)
	}
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.r.line(w.prefix + w.buf.String())
		w.buf.Reset()
	}
}
