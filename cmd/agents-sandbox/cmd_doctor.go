package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// check is one doctor finding.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Optional checks do not fail doctor.
	Optional bool `json:"optional,omitempty"`
}

func newDoctorCommand(a *app) *cobra.Command {
	var flags struct{ json bool }
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can run sandboxes, and say how to fix what is missing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			checks := a.doctor(cmd.Context())
			failed := 0
			for _, c := range checks {
				if !c.OK && !c.Optional {
					failed++
				}
			}
			if flags.json {
				enc := json.NewEncoder(a.streams.Out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(map[string]any{"ok": failed == 0, "checks": checks}); err != nil {
					return err
				}
			} else {
				for _, c := range checks {
					mark := "ok  "
					switch {
					case !c.OK && c.Optional:
						mark = "warn"
					case !c.OK:
						mark = "FAIL"
					}
					fmt.Fprintf(a.streams.Out, "[%s] %-14s %s\n", mark, c.Name, c.Detail)
					if !c.OK && c.Fix != "" {
						fmt.Fprintf(a.streams.Out, "       %-14s fix: %s\n", "", c.Fix)
					}
				}
			}
			if failed > 0 {
				if !flags.json {
					fmt.Fprintf(a.streams.Err, "agents-sandbox: doctor found %d problem(s)\n", failed)
				}
				return exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&flags.json, "json", false, "print JSON")
	return cmd
}

func (a *app) doctor(ctx context.Context) []check {
	var out []check
	engine, version := a.checkEngine(ctx)
	out = append(out, engine)
	if version != "" {
		out = append(out, checkEngineDNS(version))
	}

	if path, err := exec.LookPath("git"); err != nil {
		out = append(out, check{Name: "git", Detail: "git not found on PATH", Fix: "install git (apt-get install git, brew install git)"})
	} else {
		v, err := exec.CommandContext(ctx, path, "--version").Output()
		if err != nil {
			out = append(out, check{Name: "git", Detail: fmt.Sprintf("%s --version failed: %v", path, err), Fix: "reinstall git"})
		} else {
			out = append(out, check{Name: "git", OK: true, Detail: strings.TrimSpace(string(v))})
		}
	}

	kvm := check{Name: "kvm", Optional: true}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		kvm.OK, kvm.Detail = true, "/dev/kvm is usable (VM-based OCI runtimes such as kata-runtime can work)"
	} else {
		kvm.Detail = fmt.Sprintf("/dev/kvm not usable (%v); only needed for VM-isolated OCI runtimes such as kata-runtime", err)
		kvm.Fix = "enable virtualization in firmware, load kvm_intel/kvm_amd, add your user to the kvm group; or keep the default runc/runsc"
	}
	out = append(out, kvm)

	st := check{Name: "state dir", Detail: a.dirs.State}
	if err := os.MkdirAll(a.dirs.State, 0o700); err != nil {
		st.Detail = fmt.Sprintf("cannot create %s: %v", a.dirs.State, err)
		st.Fix = "set XDG_STATE_HOME to a writable directory, or fix the permissions of " + a.dirs.State
	} else if f, err := os.CreateTemp(a.dirs.State, ".doctor-*"); err != nil {
		st.Detail = fmt.Sprintf("%s is not writable: %v", a.dirs.State, err)
		st.Fix = "fix the permissions of " + a.dirs.State + " or set XDG_STATE_HOME"
	} else {
		f.Close()
		os.Remove(f.Name())
		st.OK, st.Detail = true, a.dirs.State+" is writable"
	}
	out = append(out, st)
	return out
}

// checkEngineDNS warns about engines whose embedded DNS forwards queries
// from internal networks through the host (CVE-2024-29018, fixed in
// 23.0.11, 25.0.4 and 26.0.0): a VM in proxy mode could then leak data in
// DNS queries.
func checkEngineDNS(version string) check {
	c := check{Name: "engine DNS", Optional: true}
	var maj, min, patch int
	fmt.Sscanf(version, "%d.%d.%d", &maj, &min, &patch)
	fixed := maj >= 26 || (maj == 25 && (min > 0 || patch >= 4)) || (maj == 23 && (min > 0 || patch >= 11))
	if fixed {
		c.OK, c.Detail = true, "Docker "+version+" does not forward DNS from internal networks through the host"
		return c
	}
	c.Detail = "Docker " + version + " forwards DNS queries from internal networks through the host (CVE-2024-29018): a VM in proxy mode could leak data in DNS names"
	c.Fix = "upgrade the Docker engine to 26.0 or later (or 25.0.4+, 23.0.11+)"
	return c
}

func (a *app) checkEngine(ctx context.Context) (check, string) {
	c := check{Name: "docker engine"}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rt, err := a.runtime(ctx)
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "install Docker (apt-get install docker.io) and start it (systemctl start docker, or dockerd &); check DOCKER_HOST and that you may use its socket (docker group)"
		return c, ""
	}
	info, err := rt.Info(ctx)
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "start the Docker engine (systemctl start docker, or dockerd &); check DOCKER_HOST and the socket's permissions"
		return c, ""
	}
	c.OK = true
	c.Detail = fmt.Sprintf("Docker %s, API %s, %s/%s, storage %s, OCI runtimes %s", info.Version, info.APIVersion, info.OS, info.Arch, info.StorageDriver, strings.Join(info.OCIRuntimes, ","))
	return c, info.Version
}
