# agents-sandbox tasks. `just` lists them; `bash .ci/run` sets up a fresh machine and runs `just test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

staticcheck := "honnef.co/go/tools/cmd/staticcheck@v0.8.2"

# list the recipes
default:
    @just --list

# build bin/agents-sandbox
build:
    CGO_ENABLED=0 go build -trimpath -o bin/agents-sandbox ./cmd/agents-sandbox

# all tests, Docker ones included (makes the fixture images first when an engine answers)
test:
    #!/usr/bin/env bash
    set -euo pipefail
    if timeout 20 docker version --format '{{{{.Server.Version}}' >/dev/null 2>&1; then
        testdata/fixtures/base-images.sh
    else
        echo "just test: no Docker engine answers; not making fixture images (tests that need Docker will skip, or fail when CI=true)" >&2
    fi
    go test -count=1 -timeout 25m ./...

# fast tests only: -short skips everything that needs the Docker engine
test-short:
    go test -short ./...

# end-to-end tests (test names containing E2E)
e2e:
    go test -count=1 -run 'E2E' ./...

# go vet, gofmt and staticcheck (fetched through the Go module proxy on first use)
lint:
    go vet ./...
    @unformatted=$(find . -name '*.go' -not -path './bin/*' -not -path '*/testdata/*' -not -path './.git/*' -print0 | xargs -0 -r gofmt -l); \
        if [ -n "$unformatted" ]; then printf 'gofmt would change:\n%s\n' "$unformatted" >&2; exit 1; fi
    go run {{staticcheck}} ./...

# benchmarks under bench/, if any (flags go to the bench program: just bench -rows exec -n-fast 11)
bench *ARGS:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -d bench ]; then
        echo "no benchmarks yet (bench/ does not exist)"
        exit 0
    fi
    if [ "$(go list -f '{{{{.Name}}' ./bench 2>/dev/null)" = main ]; then
        go run ./bench {{ARGS}}
    fi
    if [ -n "$(find bench -name '*_test.go' -print -quit)" ]; then
        go test -run '^$' -bench . -benchtime 1x ./bench/...
    fi

# make the local base images the Docker tests need (debian:bookworm-slim, agents-sandbox-test/busybox:latest)
fixtures *ARGS:
    testdata/fixtures/base-images.sh {{ARGS}}
