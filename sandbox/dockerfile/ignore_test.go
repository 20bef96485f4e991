package dockerfile

import (
	"reflect"
	"strings"
	"testing"
)

func TestReadIgnore(t *testing.T) {
	t.Parallel()
	in := "\xEF\xBB\xBF# comment\n" +
		"node_modules\n" +
		"  *.log  \n" +
		"\n" +
		"   # not a comment: only a leading '#' is\n" +
		"/abs/path\n" +
		"!  keep.log\n" +
		"a/../b/./c/\n" +
		"!/x\n" +
		"**/tmp/**\n"
	got, err := ReadIgnore(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"node_modules", "*.log", "# not a comment: only a leading '#' is", "abs/path", "!keep.log", "b/c", "!x", "**/tmp/**"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadIgnore:\n got %q\nwant %q", got, want)
	}
}

// TestPatternMatch checks single patterns against paths, Docker's matching
// rules for '*', '?', '**', classes and escapes (without parent matching).
func TestPatternMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"*", "file", true},
		{"*", "dir/file", false},
		{"*.go", "main.go", true},
		{"*.go", "pkg/main.go", false},
		{"**", "dir/file", true},
		{"**/", "file", true},
		{"**/**", "dir/file", true},
		{"dir/**", "dir/file", true},
		{"dir/**", "dir/sub/file", true},
		{"dir/**", "dir", false},
		{"**/dir", "dir", true},
		{"**/dir", "a/b/dir", true},
		{"**/dir", "a/bdir", false},
		{"**file", "file", true},
		{"**file", "a/b/file", true},
		{"**file", "a/bfile", true},
		{"**/dir2/*", "dir/dir2/file", true},
		{"**/dir2/*", "dir/dir2/file/x", false},
		{"**/dir2/**", "dir/dir2/dir3/file", true},
		{"**/*.txt", "file.txt", true},
		{"**/**/*.txt", "a/b/file.txt", true},
		{"**/**/*.txt2", "a/b/file.txt", false},
		{"a**/*.txt", "a/file.txt", true},
		{"a**/*.txt", "a/b/c/file.txt", true},
		{"a/*.txt", "a/b/file.txt", false},
		{"a[b-d]e", "ace", true},
		{"a[b-d]e", "aae", false},
		{"a[^b-d]e", "aze", true},
		{".*", ".env", true},
		{".*", "env", false},
		{"abc.def", "abcxdef", false},
		{"abc?def", "abcxdef", true},
		{"abc?def", "abc/def", false},
		{"a(b)c/d+e", "a(b)c/d+e", true},
		{`a\*b`, "a*b", true},
		{`a\*b`, "axb", false},
		{"dist/*.whl", "dist/pkg-1.0+g1-py3-none-any.whl", true},
	}
	for _, tt := range tests {
		m, err := NewMatcher([]string{tt.pattern})
		if err != nil {
			t.Fatalf("NewMatcher(%q): %v", tt.pattern, err)
		}
		if got := m.patterns[0].match(tt.path); got != tt.want {
			t.Errorf("pattern %q matches %q = %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
	}
}

// TestExcluded checks whole pattern lists with parent-directory matching
// and '!' exceptions: the last pattern that matches decides.
func TestExcluded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		patterns []string
		path     string
		want     bool
	}{
		{nil, "anything", false},
		{[]string{"docs"}, "docs", true},
		{[]string{"docs"}, "docs/a/b.md", true},
		{[]string{"docs"}, "src/docs", false},
		{[]string{"docs", "!docs/README.md"}, "docs/README.md", false},
		{[]string{"docs", "!docs/README.md"}, "docs/other.md", true},
		{[]string{"docs/*", "!docs/README.md"}, "docs/README.md", false},
		{[]string{"*.go", "!main.go"}, "main.go", false},
		{[]string{"!main.go", "*.go"}, "main.go", true},
		{[]string{"*.md", "!README.md", "README.md"}, "README.md", true},
		{[]string{"**", "!src"}, "src/a/b.go", false},
		{[]string{"**", "!src"}, "other/b.go", true},
		{[]string{"**", "!util/docker/web"}, "util/docker/web/foo", false},
		{[]string{"**", "!util/docker/web", "util/docker/web/foo"}, "util/docker/web/foo", true},
		{[]string{"**/node_modules"}, "a/node_modules/x/index.js", true},
		{[]string{"**/*.log"}, "a/b/c.log", true},
		{[]string{"*/temp*"}, "somedir/temporary.txt", true},
		{[]string{"*/temp*"}, "a/b/temp", false},
		{[]string{".git"}, ".git/config", true},
		{[]string{".git", "!.git"}, ".git/config", false},
	}
	for _, tt := range tests {
		m, err := NewMatcher(tt.patterns)
		if err != nil {
			t.Fatalf("NewMatcher(%q): %v", tt.patterns, err)
		}
		if got := m.Excluded(tt.path); got != tt.want {
			t.Errorf("patterns %q exclude %q = %v, want %v", tt.patterns, tt.path, got, tt.want)
		}
	}
}

func TestSkipDir(t *testing.T) {
	t.Parallel()
	tests := []struct {
		patterns []string
		dir      string
		want     bool
	}{
		{[]string{"docs"}, "docs", true},
		{[]string{"docs", "!docs/README.md"}, "docs", false},
		{[]string{"docs", "!docs/README.md"}, "docsx", true},
		{[]string{"a", "!a/b/c"}, "a/b", false},
		// Docker's walker does not look inside for a '**' exception.
		{[]string{"a", "!**/keep"}, "a", true},
	}
	for _, tt := range tests {
		m, err := NewMatcher(tt.patterns)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.SkipDir(tt.dir); got != tt.want {
			t.Errorf("patterns %q SkipDir(%q) = %v, want %v", tt.patterns, tt.dir, got, tt.want)
		}
	}
}

func TestNewMatcherErrors(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"!", "[", "a[", "[^bc", "[x-]", `\`} {
		if _, err := NewMatcher([]string{p}); err == nil {
			t.Errorf("NewMatcher(%q) succeeded, want an error", p)
		}
	}
}
