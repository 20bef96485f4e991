// Command migratehelper runs one migration from the origin-keyed layout for
// the tests in sandbox/migrate_test.go, which build it and kill it between
// two steps: right after the step named by MIGRATE_HELPER_STOP_AT has been
// carried out for the MIGRATE_HELPER_STOP_N-th time (default 1), it prints
// "stopped after <step> <target>" on stdout and waits on stdin until it is
// killed (or exits 3 without finishing when stdin closes).
//
// Environment: MIGRATE_HELPER_DIR (the checkout), MIGRATE_HELPER_STATE and
// MIGRATE_HELPER_CONFIG (Dirs.State and Dirs.Config), MIGRATE_HELPER_AGENT.
// It prints "done" when the migration ran to the end. Logs go to stderr.
//
// It lives under testdata so that `go build ./...` and `go vet ./...` leave
// it out: it is a test fixture, not part of agents-sandbox.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "migratehelper: %v\n", err)
		os.Exit(2)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := zerolog.New(os.Stderr)
	id, err := sandbox.Resolve(os.Getenv("MIGRATE_HELPER_DIR"))
	if err != nil {
		return err
	}
	rt, err := docker.New(ctx, docker.Options{Logger: log})
	if err != nil {
		return err
	}
	defer rt.Close()
	m := &sandbox.Manager{RT: rt, Log: log, Dirs: sandbox.Dirs{
		State:  os.Getenv("MIGRATE_HELPER_STATE"),
		Config: os.Getenv("MIGRATE_HELPER_CONFIG"),
	}}
	stopAt := sandbox.MigrationStep(os.Getenv("MIGRATE_HELPER_STOP_AT"))
	want, _ := strconv.Atoi(os.Getenv("MIGRATE_HELPER_STOP_N"))
	if want < 1 {
		want = 1
	}
	seen := 0
	_, err = m.MigrateCheckout(ctx, id, os.Getenv("MIGRATE_HELPER_AGENT"), sandbox.MigrateOptions{
		OnStep: func(a sandbox.MigrationAction) {
			if a.Step != stopAt {
				return
			}
			if seen++; seen < want {
				return
			}
			fmt.Printf("stopped after %s %s\n", a.Step, a.Target)
			_, _ = io.Copy(io.Discard, os.Stdin) // until killed
			os.Exit(3)
		},
	})
	if err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}
