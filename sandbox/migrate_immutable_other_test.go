//go:build !linux

package sandbox_test

import "errors"

// mgImmutable: only Linux has the immutable attribute the test uses.
func mgImmutable(string, bool) error {
	return errors.New("no immutable attribute on this system")
}
