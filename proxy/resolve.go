package proxy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// SecretCommandTimeout bounds a "command:" secret source.
const SecretCommandTimeout = 30 * time.Second

// ResolveSecretValue reads a secret's value on the host from its source:
//
//   - "env:NAME": the environment variable NAME;
//   - "file:PATH": the file's content; "~" or "~/" at the start means the user's home, and a
//     relative path is relative to baseDir (the directory of the config file that names it);
//   - "command:CMD": the standard output of `sh -c CMD`, run in baseDir with empty standard input
//     for at most SecretCommandTimeout (and as long as ctx lasts).
//
// Leading and trailing white space is trimmed; an empty result is an error. Errors name the source
// and say how to fix it; they never include the value (for a failed command they may quote the
// last line of its standard error, unless that line holds its standard output).
func ResolveSecretValue(ctx context.Context, from string, baseDir string) (string, error) {
	return ResolveSecretValueEnv(ctx, from, baseDir, nil)
}

// ResolveSecretValueEnv is ResolveSecretValue with the environment given as environ (KEY=VALUE
// entries, as os.Environ returns them) instead of the process's: "env:NAME" reads NAME from it,
// "~" in a "file:" path is its HOME, and a "command:" source runs with it as its environment.
// A nil environ means the process's environment.
func ResolveSecretValueEnv(ctx context.Context, from string, baseDir string, environ []string) (string, error) {
	lookup := os.LookupEnv
	if environ != nil {
		lookup = func(k string) (string, bool) { return lookupEnv(environ, k) }
	}
	kind, arg, ok := strings.Cut(from, ":")
	if !ok || arg == "" {
		return "", fmt.Errorf("secret source %q: want env:NAME, file:PATH or command:CMD", from)
	}
	var v string
	switch kind {
	case "env":
		val, ok := lookup(arg)
		if !ok {
			return "", fmt.Errorf("secret source %s: environment variable %s is not set: export it where agents-sandbox runs, or change the source", from, arg)
		}
		v = val
	case "file":
		path, err := expandPath(arg, baseDir, lookup)
		if err != nil {
			return "", fmt.Errorf("secret source %s: %w", from, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("secret source %s: %w: create the file or change the source", from, err)
		}
		v = string(b)
	case "command":
		out, err := runSecretCommand(ctx, arg, baseDir, environ)
		if err != nil {
			return "", fmt.Errorf("secret source %s: %w", from, err)
		}
		v = out
	default:
		return "", fmt.Errorf("secret source %q: unknown kind %q: want env:NAME, file:PATH or command:CMD", from, kind)
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return "", fmt.Errorf("secret source %s: the value is empty", from)
	}
	return v, nil
}

// lookupEnv returns the last value of k in environ.
func lookupEnv(environ []string, k string) (string, bool) {
	for i := len(environ) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(environ[i], k+"="); ok {
			return v, true
		}
	}
	return "", false
}

func expandPath(p, baseDir string, lookup func(string) (string, bool)) (string, error) {
	if p == "~" || strings.HasPrefix(p, "~/") {
		home, ok := lookup("HOME")
		if !ok || home == "" {
			return "", fmt.Errorf("expand ~: $HOME is not set")
		}
		p = filepath.Join(home, strings.TrimPrefix(p, "~"))
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(baseDir, p)
	}
	return p, nil
}

func runSecretCommand(ctx context.Context, command, dir string, environ []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, SecretCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = nil
	cmd.Dir = dir
	cmd.Env = environ // nil: the process's environment
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second // a child that keeps the pipes open must not hang us
	err := cmd.Run()
	if ctx.Err() != nil {
		return "", fmt.Errorf("command did not finish within %s (or was cancelled): make it non-interactive and fast", SecretCommandTimeout)
	}
	if err != nil {
		hint := lastLine(stderr.String())
		out := strings.TrimSpace(stdout.String())
		if hint != "" && (out == "" || !strings.Contains(hint, out)) {
			return "", fmt.Errorf("command failed: %w: %s", err, truncate(hint, 200))
		}
		return "", fmt.Errorf("command failed: %w: run it in a shell to see why", err)
	}
	return stdout.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}
