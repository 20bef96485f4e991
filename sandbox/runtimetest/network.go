package runtimetest

import (
	"errors"
	"testing"
	"time"

	"github.com/agents-sandbox/agents-sandbox/sandbox"
)

func (s *suite) testNetworks(t *testing.T) {
	nw, ok := s.rt.(sandbox.Networker)
	if !ok {
		t.Skip("the runtime does not implement sandbox.Networker")
	}
	ctx := s.ctx(t)
	const role = "org.agents-sandbox.test-role"
	name := s.name("net")
	n, err := nw.CreateNetwork(ctx, sandbox.NetworkSpec{Name: name, Internal: true, Labels: s.with(map[string]string{role: "net"})})
	if err != nil {
		t.Fatalf("CreateNetwork: %v", err)
	}
	t.Cleanup(func() {
		cctx, cancel := cleanupCtx()
		defer cancel()
		if err := nw.RemoveNetwork(cctx, n.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("cleanup: RemoveNetwork %s: %v", name, err)
		}
	})
	if n.Name != name || n.ID == "" || !n.Internal || n.Labels[role] != "net" {
		t.Errorf("CreateNetwork = %+v", n)
	}
	if _, err := nw.CreateNetwork(ctx, sandbox.NetworkSpec{Name: name, Labels: s.labels}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("CreateNetwork with a taken name: err = %v, want ErrConflict", err)
	}
	if got, err := nw.InspectNetwork(ctx, name); err != nil || got.ID != n.ID || !got.Internal {
		t.Errorf("InspectNetwork = %+v, %v", got, err)
	}
	if list, err := nw.ListNetworks(ctx, map[string]string{LabelRun: s.runID, role: "net"}); err != nil || len(list) != 1 || list[0].ID != n.ID {
		t.Errorf("ListNetworks by label = %+v, %v; want only %s", list, err, name)
	}
	if _, err := nw.InspectNetwork(ctx, s.name("no-such-net")); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("InspectNetwork of a missing network: err = %v, want ErrNotFound", err)
	}

	// (busybox-static's wget crashes with -T, hence timeout(1).)
	// A server on the internal network under an alias, and a client that
	// joins the network after it was created.
	srv := s.startedVM(t, sandbox.VMSpec{
		Name: s.name("net-srv"), Network: name, NetworkAliases: []string{"ast-srv"}, Init: true,
		Cmd: []string{"sh", "-c", "mkdir -p /www && echo hello-over-net > /www/index.html && exec httpd -f -p 8080 -h /www"},
	})
	cli := s.createVM(t, sandbox.VMSpec{Name: s.name("net-cli")})
	if err := nw.ConnectNetwork(ctx, name, cli.Name, []string{"ast-cli"}); err != nil {
		t.Fatalf("ConnectNetwork: %v", err)
	}
	if err := s.rt.StartVM(ctx, cli.Name); err != nil {
		t.Fatalf("StartVM: %v", err)
	}
	if err := nw.ConnectNetwork(ctx, name, cli.Name, nil); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("ConnectNetwork of a running VM already attached: err = %v, want ErrConflict", err)
	}
	if err := nw.ConnectNetwork(ctx, s.name("no-such-net"), cli.Name, nil); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ConnectNetwork to a missing network: err = %v, want ErrNotFound", err)
	}

	got := s.inspect(t, srv.Name)
	if got.Networks[name] == "" {
		t.Errorf("InspectVM networks = %v; want an address on %s", got.Networks, name)
	}
	var out string
	waitFor(t, 20*time.Second, "the client to fetch from the server by alias", func() bool {
		var code int
		out, _, code = s.exec(t, cli.Name, sandbox.ExecRequest{Cmd: []string{"timeout", "5", "wget", "-q", "-O", "-", "http://ast-srv:8080/"}})
		return code == 0
	})
	if out != "hello-over-net\n" {
		t.Errorf("client fetched %q, want %q", out, "hello-over-net\n")
	}
	// And back, by the alias given at connect time.
	if _, errOut, code := s.exec(t, srv.Name, sandbox.ExecRequest{Cmd: []string{"nslookup", "ast-cli"}}); code != 0 {
		t.Errorf("the server cannot resolve the client's alias: exit %d, %s", code, errOut)
	}

	if err := nw.RemoveNetwork(ctx, name); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("RemoveNetwork with VMs attached: err = %v, want ErrConflict", err)
	}
}
