package proxy

import (
	"bytes"
	"cmp"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

// chunkReader returns data in reads whose sizes cycle through sizes (each at least 1).
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)])%17 + 1
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// referenceReplace is strings.Replacer with the longest pattern first, which is the semantics the
// streaming replacer promises: leftmost match, longest at one position.
func referenceReplace(s string, pats, repls []string) string {
	idx := make([]int, len(pats))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(len(pats[b]), len(pats[a])) })
	var oldnew []string
	for _, i := range idx {
		oldnew = append(oldnew, pats[i], repls[i])
	}
	return strings.NewReplacer(oldnew...).Replace(s)
}

func fuzzPatterns(spec string) (pats, repls []string) {
	seen := map[string]bool{}
	for _, p := range strings.Split(spec, "|") {
		if p == "" || len(p) > 24 || seen[p] || len(pats) == 4 {
			continue
		}
		seen[p] = true
		pats = append(pats, p)
		repls = append(repls, "<"+strings.Repeat("#", len(pats))+">")
	}
	return pats, repls
}

func FuzzReplacingReader(f *testing.F) {
	ph := NewPlaceholder("TOKEN")
	f.Add(ph+"|other", []byte("a "+ph+" b "+ph[:9]), []byte{3, 1, 250})
	f.Add("ab|abc|bcd", []byte("xxabcdabcabab"), []byte{1})
	f.Add("aaa|aa", []byte("aaaaaaaaa"), []byte{2, 5})
	f.Add("x", []byte(""), []byte{})
	f.Add("needle", bytes.Repeat([]byte("needl"), 100), []byte{7, 0, 3})
	f.Fuzz(func(t *testing.T, spec string, input []byte, sizes []byte) {
		pats, repls := fuzzPatterns(spec)
		var oldnew []string
		for i := range pats {
			oldnew = append(oldnew, pats[i], repls[i])
		}
		want := referenceReplace(string(input), pats, repls)
		r := NewReplacingReader(&chunkReader{data: input, sizes: sizes}, oldnew...)
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("patterns %q, input %q, sizes %v:\n got %q\nwant %q", pats, input, sizes, got, want)
		}
		// Same through one-byte reads of a one-byte reader.
		got, err = io.ReadAll(iotest.OneByteReader(NewReplacingReader(iotest.OneByteReader(bytes.NewReader(input)), oldnew...)))
		if err != nil || string(got) != want {
			t.Fatalf("one-byte: got %q, %v; want %q", got, err, want)
		}
	})
}

func TestReplacingReaderLargeAndErrors(t *testing.T) {
	t.Parallel()
	ph := NewPlaceholder("BIG")
	input := strings.Repeat("x", replaceChunk-5) + ph + strings.Repeat("y", 3*replaceChunk) + ph
	got, err := io.ReadAll(NewReplacingReader(strings.NewReader(input), ph, "V"))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.ReplaceAll(input, ph, "V"); string(got) != want {
		t.Errorf("placeholder across the internal chunk boundary not replaced")
	}
	// A source error comes after the bytes before it.
	r := NewReplacingReader(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(io.ErrUnexpectedEOF)), "b", "B")
	got, err = io.ReadAll(r)
	if string(got) != "aBc" || err != io.ErrUnexpectedEOF {
		t.Errorf("got %q, %v", got, err)
	}
	if err := iotest.TestReader(NewReplacingReader(strings.NewReader(input), ph, "V"), []byte(strings.ReplaceAll(input, ph, "V"))); err != nil {
		t.Error(err)
	}
}

func TestRedactingWriter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := RedactingWriter(&out, "s3cret-value", "", "other")
	for _, p := range []string{`{"msg":"token s3cr`, `et-value here"}` + "\n", "and oth", "er\n", "ends with s3c"} {
		if n, err := w.Write([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if strings.Contains(out.String(), "s3c") && !strings.HasSuffix(out.String(), "er\n") {
		t.Errorf("held bytes written early: %q", out.String())
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `{"msg":"token [REDACTED] here"}` + "\nand [REDACTED]\nends with s3c"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}

	// Concurrent writers (zerolog does not serialize writes).
	var buf syncBuffer
	cw := RedactingWriter(&buf, "s3cret-value")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = cw.Write([]byte("line s3cret-value\n"))
			}
		})
	}
	wg.Wait()
	if strings.Contains(buf.String(), "s3cret") || strings.Count(buf.String(), Redacted) != 800 {
		t.Errorf("concurrent writes not all redacted")
	}
}

// TestReplacingReaderDenseMatches guards against quadratic rescanning when matches are dense.
func TestReplacingReaderDenseMatches(t *testing.T) {
	t.Parallel()
	input := strings.Repeat("a", 4<<20)
	got, err := io.ReadAll(NewReplacingReader(strings.NewReader(input), "a", "b", "ab", "c", "zzzz", "y"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != strings.Repeat("b", 4<<20) {
		t.Errorf("dense replacement wrong")
	}
}
