package main

import (
	"context"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
	"github.com/agents-sandbox/agents-sandbox/sandbox/docker"
)

// runtime connects to the configured runtime driver (Docker, the only one
// so far). The connection is negotiated once per process.
func (a *app) runtime(ctx context.Context) (sandbox.Runtime, error) {
	if a.rt != nil {
		return a.rt, nil
	}
	d, err := docker.New(ctx, docker.Options{Logger: a.log})
	if err != nil {
		return nil, err
	}
	a.rt = d
	return d, nil
}
