// Package schemas embeds the project's JSON Schema files (draft 2020-12):
// one input and one output schema per tool (`<tool>.input.json`,
// `<tool>.output.json`), served verbatim as the MCP tool schemas and used for
// validation by both front ends, and `config.schema.json`, which describes the
// TOML configuration. Every file is self-contained (no cross-file $ref).
package schemas

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
)

//go:embed *.json
var files embed.FS

// Get returns the bytes of the schema file called name, e.g.
// "sandbox_exec.input.json" or "config.schema.json". The caller may modify
// the returned slice. Errors: no such file (wrapping fs.ErrNotExist).
func Get(name string) ([]byte, error) {
	if !fs.ValidPath(name) || name == "." {
		return nil, fmt.Errorf("schema %q: %w", name, fs.ErrNotExist)
	}
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("schema %q: %w", name, err)
	}
	return b, nil
}

// Names returns the file names of every embedded schema, sorted.
func Names() []string {
	entries, err := files.ReadDir(".")
	if err != nil {
		return nil // cannot happen: the embedded root always exists
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names
}
