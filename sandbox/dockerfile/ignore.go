package dockerfile

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
	"text/scanner"
)

// This file re-implements Docker's .dockerignore semantics as the Docker CLI
// and github.com/moby/patternmatcher (not in this module's graph) define
// them, for '/'-separated paths relative to the context root:
//
//   - ReadIgnore: one pattern a line; a line starting with '#' is a comment;
//     surrounding blanks are trimmed; a leading '!' makes an exception;
//     patterns are cleaned (path.Clean) and a leading '/' dropped.
//   - A pattern matches a path when filepath.Match-style globbing matches the
//     whole path ('*' and '?' never cross '/', '[...]' classes, '\' escapes),
//     with '**' matching any number of directories, zero included.
//   - A path is excluded when the last pattern matching it, or matching one of
//     its parent directories, is not an exception.
//   - An excluded directory is not descended into unless an exception pattern
//     starts with that directory's path (Docker's archive walker rule; so
//     "!**/keep" does not bring back files under an excluded directory).

// ReadIgnore parses a .dockerignore file into patterns, exceptions prefixed
// with '!'. A UTF-8 byte order mark is skipped. Errors come from the reader.
func ReadIgnore(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	first := true
	for sc.Scan() {
		line := sc.Bytes()
		if first {
			line = bytes.TrimPrefix(line, []byte{0xEF, 0xBB, 0xBF})
			first = false
		}
		p := string(line)
		if strings.HasPrefix(p, "#") {
			continue
		}
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		invert := p[0] == '!'
		if invert {
			p = strings.TrimSpace(p[1:])
		}
		if p != "" {
			p = path.Clean(p)
			if len(p) > 1 && p[0] == '/' {
				p = p[1:]
			}
		}
		if invert {
			p = "!" + p
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	return out, nil
}

type matchType int

const (
	matchExact matchType = iota
	matchPrefix
	matchSuffix
	matchRegexp
)

type pattern struct {
	text      string // cleaned, without '!'
	exception bool
	kind      matchType
	re        *regexp.Regexp
}

// Matcher decides which context paths a list of .dockerignore patterns
// excludes. It is immutable and safe for concurrent use.
type Matcher struct {
	patterns   []pattern
	exceptions bool
}

// NewMatcher compiles patterns as ReadIgnore returns them. A lone "!" or a
// malformed pattern ("[a-") is an error.
func NewMatcher(patterns []string) (*Matcher, error) {
	m := &Matcher{}
	for _, raw := range patterns {
		p := strings.TrimSpace(raw)
		if p == "" {
			continue
		}
		p = path.Clean(p)
		var pt pattern
		if p[0] == '!' {
			if len(p) == 1 {
				return nil, fmt.Errorf(".dockerignore: illegal exception pattern %q", raw)
			}
			pt.exception = true
			p = p[1:]
			m.exceptions = true
		}
		// Syntax check as Docker does it: path.Match reports malformed
		// classes and escapes.
		if _, err := path.Match(p, "."); err != nil {
			return nil, fmt.Errorf(".dockerignore: pattern %q: %w", raw, err)
		}
		pt.text = p
		if err := pt.compile(); err != nil {
			return nil, fmt.Errorf(".dockerignore: pattern %q: %w", raw, err)
		}
		m.patterns = append(m.patterns, pt)
	}
	return m, nil
}

// compile turns a pattern into a match strategy, as patternmatcher does.
func (p *pattern) compile() error {
	re := "^"
	var sc scanner.Scanner
	sc.Init(strings.NewReader(p.text))
	sc.Mode = 0 // characters only
	sc.Error = func(*scanner.Scanner, string) {}
	p.kind = matchExact
	for i := 0; sc.Peek() != scanner.EOF; i++ {
		ch := sc.Next()
		switch {
		case ch == '*':
			if sc.Peek() == '*' {
				sc.Next()
				if sc.Peek() == '/' {
					sc.Next()
				}
				if sc.Peek() == scanner.EOF {
					// A trailing "**" matches everything below.
					if p.kind == matchExact {
						p.kind = matchPrefix
					} else {
						re += ".*"
						p.kind = matchRegexp
					}
				} else {
					re += "(.*/)?"
					p.kind = matchRegexp
				}
				if i == 0 {
					p.kind = matchSuffix
				}
			} else {
				re += "[^/]*"
				p.kind = matchRegexp
			}
		case ch == '?':
			re += "[^/]"
			p.kind = matchRegexp
		case strings.ContainsRune(".+()|{}$", ch):
			re += `\` + string(ch)
		case ch == '\\':
			if sc.Peek() != scanner.EOF {
				re += `\` + string(sc.Next())
				p.kind = matchRegexp
			} else {
				re += `\\`
			}
		case ch == '[' || ch == ']':
			re += string(ch)
			p.kind = matchRegexp
		default:
			re += string(ch)
		}
	}
	if p.kind != matchRegexp {
		return nil
	}
	compiled, err := regexp.Compile(re + "$")
	if err != nil {
		return err
	}
	p.re = compiled
	return nil
}

func (p *pattern) match(name string) bool {
	switch p.kind {
	case matchExact:
		return name == p.text
	case matchPrefix:
		return strings.HasPrefix(name, p.text[:len(p.text)-2])
	case matchSuffix:
		suffix := p.text[2:]
		if strings.HasSuffix(name, suffix) {
			return true
		}
		// "**/foo" matches "foo".
		return suffix[0] == '/' && name == suffix[1:]
	default:
		return p.re.MatchString(name)
	}
}

// Excluded reports whether the '/'-separated, context-relative name is
// excluded: the last pattern matching it or one of its parent directories
// decides.
func (m *Matcher) Excluded(name string) bool {
	name = path.Clean(name)
	var parents []string
	if dir := path.Dir(name); dir != "." {
		parents = strings.Split(dir, "/")
	}
	matched := false
	for i := range m.patterns {
		p := &m.patterns[i]
		// Only a pattern that can change the outcome is evaluated.
		if p.exception != matched {
			continue
		}
		hit := p.match(name)
		for j := 0; !hit && j < len(parents); j++ {
			hit = p.match(strings.Join(parents[:j+1], "/"))
		}
		if hit {
			matched = !p.exception
		}
	}
	return matched
}

// SkipDir reports whether the walker may skip the excluded directory dir
// ('/'-separated, context-relative) without looking inside: true unless an
// exception pattern starts with dir's path.
func (m *Matcher) SkipDir(dir string) bool {
	if !m.exceptions {
		return true
	}
	prefix := path.Clean(dir) + "/"
	for _, p := range m.patterns {
		if p.exception && strings.HasPrefix(p.text+"/", prefix) {
			return false
		}
	}
	return true
}
