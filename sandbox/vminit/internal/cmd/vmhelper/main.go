// Command vmhelper is a test-only stand-in for the agents-sandbox binary's VM
// subcommands (vm-init, vm-exec, vm-kill), built static and run inside a
// container by the vminit Docker test.
package main

import (
	"context"
	"os"

	"github.com/agents-sandbox/agents-sandbox/sandbox/vminit/internal/vmcli"
)

func main() {
	os.Exit(vmcli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
