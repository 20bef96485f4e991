package dockerfile

import (
	"errors"
	"strings"
	"testing"
)

func TestRenderErrors(t *testing.T) {
	t.Parallel()
	ok := Params{Base: "debian:bookworm-slim", Agent: "shell", UID: 1000, GID: 1000}
	tests := []struct {
		name   string
		change func(*Params)
		want   string
	}{
		{"empty base", func(p *Params) { p.Base = "" }, "image.base"},
		{"base with a space", func(p *Params) { p.Base = "debian:bookworm slim" }, "image.base"},
		{"base with a newline", func(p *Params) { p.Base = "debian\nRUN rm -rf /" }, "image.base"},
		{"base with quotes", func(p *Params) { p.Base = `debian";x` }, "image.base"},
		{"agent name", func(p *Params) { p.Agent = "Bad Name" }, "agent name"},
		{"root uid", func(p *Params) { p.UID = 0 }, "above 0"},
		{"root gid", func(p *Params) { p.GID = 0 }, "above 0"},
		{"cert outside its dir", func(p *Params) { p.CACerts = []string{"../x.crt"} }, "ca-certificates/"},
	}
	for _, tt := range tests {
		p := ok
		tt.change(&p)
		_, err := Render(p)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want ErrInvalid mentioning %q", tt.name, err, tt.want)
		}
	}
	for _, base := range []string{"debian:bookworm-slim", "ubuntu", "registry.example.com:5000/a/b:c", "debian@sha256:0123abcd"} {
		p := ok
		p.Base = base
		if _, err := Render(p); err != nil {
			t.Errorf("base %q: %v", base, err)
		}
	}
}

// A single-line install script goes in unchanged; the JSON form keeps
// characters HTML escaping would mangle.
func TestRenderInstall(t *testing.T) {
	t.Parallel()
	b, err := Render(Params{Base: "debian", Agent: "a", UID: 1, GID: 1, Install: "echo '<a & b>' > /x"})
	if err != nil {
		t.Fatal(err)
	}
	want := `RUN ["/bin/bash", "-eo", "pipefail", "-c", "echo '<a & b>' > /x"]`
	if !strings.Contains(string(b), want) {
		t.Errorf("Dockerfile lacks %s:\n%s", want, b)
	}
	b, err = Render(Params{Base: "debian", Agent: "a", UID: 1, GID: 1, Install: "  \n "})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "installed as root") {
		t.Errorf("a blank install script still got a RUN step:\n%s", b)
	}
}
