package proxy

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sync"
)

// matcher finds fixed patterns in a stream that arrives in pieces: leftmost match first, the
// longest pattern when several match at the same position, never across a replacement.
type matcher struct {
	pats [][]byte
	idx  []int // index of each pattern in the list given to newMatcher
}

// newMatcher compiles pats; empty patterns never match. The replacement callbacks receive indices
// into pats.
func newMatcher(pats [][]byte) *matcher {
	m := &matcher{}
	for i, p := range pats {
		if len(p) == 0 {
			continue
		}
		m.pats = append(m.pats, p)
		m.idx = append(m.idx, i)
	}
	return m
}

// partialStarts returns, in ascending order, the positions j such that buf[j:] is a proper prefix
// of some pattern: matches that more input may complete.
func (m *matcher) partialStarts(buf []byte) []int {
	var starts []int
	for _, p := range m.pats {
		for j := max(0, len(buf)-len(p)+1); j < len(buf); j++ {
			k := bytes.IndexByte(buf[j:], p[0])
			if k < 0 {
				break
			}
			j += k
			if bytes.HasPrefix(p, buf[j:]) {
				starts = append(starts, j)
			}
		}
	}
	slices.Sort(starts)
	return starts
}

// replace appends to dst the bytes of buf with every match replaced by repl(pattern index), and
// returns how much of buf it consumed. Unless final, it stops before a trailing possible match
// that more input could complete; the caller presents those bytes again followed by more input.
// An error from repl stops it: dst then holds the output before the match, consumed its position.
// It runs in O(len(buf) × patterns) plus the matches.
func (m *matcher) replace(dst, buf []byte, final bool, repl func(int) ([]byte, error)) ([]byte, int, error) {
	var partial []int
	if !final {
		partial = m.partialStarts(buf)
	}
	// next[j] caches the position of pattern j's next occurrence at or after i (-1: none left,
	// -2: not searched yet).
	next := make([]int, len(m.pats))
	for j := range next {
		next[j] = -2
	}
	i := 0
	for {
		pos, pat := -1, -1
		for j, p := range m.pats {
			if next[j] == -2 || next[j] >= 0 && next[j] < i {
				if k := bytes.Index(buf[i:], p); k >= 0 {
					next[j] = i + k
				} else {
					next[j] = -1
				}
			}
			if n := next[j]; n >= 0 && (pos < 0 || n < pos || n == pos && len(p) > len(m.pats[pat])) {
				pos, pat = n, j
			}
		}
		for len(partial) > 0 && partial[0] < i {
			partial = partial[1:]
		}
		hold := len(buf)
		if len(partial) > 0 {
			hold = partial[0]
		}
		if pos >= 0 && pos < hold {
			dst = append(dst, buf[i:pos]...)
			r, err := repl(m.idx[pat])
			if err != nil {
				return dst, pos, err
			}
			dst = append(dst, r...)
			i = pos + len(m.pats[pat])
			continue
		}
		dst = append(dst, buf[i:hold]...)
		return dst, hold, nil
	}
}

// replacingReader streams src through a matcher.
type replacingReader struct {
	src    io.Reader
	m      *matcher
	repl   func(int) ([]byte, error)
	buf    []byte // read buffer
	in     []byte // input not yet consumed (a possible partial match)
	out    []byte // output not yet returned
	outOff int
	err    error // sticky: from src (after in is flushed) or from repl
}

const replaceChunk = 32 << 10

func newReplacingReader(src io.Reader, m *matcher, repl func(int) ([]byte, error)) *replacingReader {
	return &replacingReader{src: src, m: m, repl: repl, buf: make([]byte, replaceChunk)}
}

// NewReplacingReader returns a reader yielding src's bytes with every occurrence of an old string
// replaced by its new string, given as old, new pairs like strings.NewReplacer. Matches are found
// even when split across src's reads; at one position the longest old string wins. It holds at
// most one read chunk (32 KiB) plus the longest old string in memory. It panics on an odd number
// of arguments.
func NewReplacingReader(src io.Reader, oldnew ...string) io.Reader {
	if len(oldnew)%2 == 1 {
		panic("proxy.NewReplacingReader: odd argument count")
	}
	var pats, repls [][]byte
	for i := 0; i < len(oldnew); i += 2 {
		pats = append(pats, []byte(oldnew[i]))
		repls = append(repls, []byte(oldnew[i+1]))
	}
	return newReplacingReader(src, newMatcher(pats), func(i int) ([]byte, error) { return repls[i], nil })
}

func (r *replacingReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for r.outOff >= len(r.out) {
		if r.err != nil {
			return 0, r.err
		}
		n, err := r.src.Read(r.buf)
		r.in = append(r.in, r.buf[:n]...)
		if n == 0 && err == nil {
			continue
		}
		final := err != nil
		out, consumed, rerr := r.m.replace(r.out[:0], r.in, final, r.repl)
		r.out, r.outOff = out, 0
		r.in = r.in[:copy(r.in, r.in[consumed:])]
		switch {
		case rerr != nil:
			r.err = rerr
		case err != nil:
			r.err = err
		}
	}
	n := copy(p, r.out[r.outOff:])
	r.outOff += n
	return n, nil
}

// RedactWriter masks known values in everything written through it. See RedactingWriter.
type RedactWriter struct {
	mu  sync.Mutex
	w   io.Writer
	m   *matcher
	in  []byte
	out []byte
}

var redactedBytes = []byte(Redacted)

// RedactingWriter wraps w so that every occurrence of one of values in the bytes written becomes
// "[REDACTED]", also when a value is split across writes: bytes that may begin a value are held
// back until the next write or Flush (log lines end in a newline, so in practice nothing is held).
// Empty values are ignored. It is safe for concurrent use; use it under a logger.
func RedactingWriter(w io.Writer, values ...string) *RedactWriter {
	var pats [][]byte
	for _, v := range values {
		pats = append(pats, []byte(v))
	}
	return &RedactWriter{w: w, m: newMatcher(pats)}
}

// Write masks p and writes what is certain to w. It returns len(p) on success.
func (rw *RedactWriter) Write(p []byte) (int, error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if len(rw.m.pats) == 0 {
		return rw.w.Write(p)
	}
	if err := rw.process(p, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes the bytes held back as a possible beginning of a value.
func (rw *RedactWriter) Flush() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.process(nil, true)
}

func (rw *RedactWriter) process(p []byte, final bool) error {
	rw.in = append(rw.in, p...)
	out, consumed, _ := rw.m.replace(rw.out[:0], rw.in, final, func(int) ([]byte, error) { return redactedBytes, nil })
	rw.out = out
	rw.in = rw.in[:copy(rw.in, rw.in[consumed:])]
	if len(out) == 0 {
		return nil
	}
	if _, err := rw.w.Write(out); err != nil {
		return fmt.Errorf("write redacted output: %w", err)
	}
	return nil
}
