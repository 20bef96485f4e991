//go:build !linux

package vminit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Init runs only inside the (Linux) VM; elsewhere it logs that and returns
// ExitWrapperError.
func Init(ctx context.Context, opts InitOptions) int {
	opts.Log.Error().Err(errors.ErrUnsupported).Msg("vm-init runs only on linux")
	return ExitWrapperError
}

// Exec runs only inside the (Linux) VM; elsewhere it says so on stderr and
// returns ExitWrapperError.
func Exec(ctx context.Context, opts ExecOptions) int {
	stderr := opts.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	fmt.Fprintln(stderr, "agents-sandbox: vm-exec runs only on linux")
	return ExitWrapperError
}

// Kill runs only inside the (Linux) VM; elsewhere it returns an error
// wrapping errors.ErrUnsupported.
func Kill(runDir, id string, sig syscall.Signal) error {
	return fmt.Errorf("kill session %q: %w", id, errors.ErrUnsupported)
}
