package sandbox

import "os"

// Test-only entry points into package internals, for the external tests in
// config_test.go and state_test.go.

// ParseConfigLayer parses one config file's content as LoadConfig does.
func ParseConfigLayer(data []byte, source string) (map[string]any, error) {
	return parseConfigLayer(data, source)
}

// DecodeOverDefaults merges a parsed layer over the built-in defaults and
// decodes the result, as LoadConfig does before Validate.
func DecodeOverDefaults(layer map[string]any) (Config, error) {
	merged := map[string]any{}
	def, err := toMap(DefaultConfig())
	if err != nil {
		return Config{}, err
	}
	origins := map[string]string{}
	mergeInto(merged, def, nil, LayerDefault, origins)
	mergeInto(merged, layer, nil, LayerProject, origins)
	return fromMap(merged, "fuzz")
}

// WriteFileAtomicHooked is WriteFileAtomic with after called each time a
// chunk of data has been written to the temp file (with the bytes written
// so far), before fsync and rename.
func WriteFileAtomicHooked(path string, data []byte, perm os.FileMode, after func(written int)) error {
	return writeFileAtomic(path, data, perm, after)
}
