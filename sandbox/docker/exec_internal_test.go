package docker

import (
	"bytes"
	"strings"
	"testing"
)

func TestStartErrSniffer(t *testing.T) {
	const engineMsg = "OCI runtime exec failed: exec failed: unable to start container process: exec: \"nope\": executable file not found in $PATH: unknown\r\n"
	for _, tc := range []struct {
		name            string
		chunks          []string
		wantOut, wantEr string
		diverted        bool
	}{
		{"plain output", []string{"hello", " world\n"}, "hello world\n", "", false},
		{"output sharing the first letter", []string{"O", "CI is fine\n"}, "OCI is fine\n", "", false},
		{"the engine's message in one write", []string{engineMsg}, "", engineMsg, true},
		{"the engine's message byte by byte", strings.Split(engineMsg, ""), "", engineMsg, true},
		{"a short prefix then EOF", []string{"OCI run"}, "OCI run", "", false},
		{"nothing", nil, "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			s := &startErrSniffer{w: &out, divert: &errOut}
			for _, c := range tc.chunks {
				if n, err := s.Write([]byte(c)); err != nil || n != len(c) {
					t.Fatalf("Write(%q) = %d, %v", c, n, err)
				}
			}
			s.flush()
			if out.String() != tc.wantOut || errOut.String() != tc.wantEr || s.diverted != tc.diverted {
				t.Errorf("stdout %q stderr %q diverted %v; want %q %q %v", out.String(), errOut.String(), s.diverted, tc.wantOut, tc.wantEr, tc.diverted)
			}
		})
	}
}

func TestStartExitCode(t *testing.T) {
	for _, tc := range []struct {
		code int
		msg  string
		want int
	}{
		{126, `exec: "nope": executable file not found in $PATH: unknown`, 127},
		{126, `exec: "/no/such": stat /no/such: no such file or directory: unknown`, 127},
		{126, `exec: "/etc/passwd": permission denied: unknown`, 126},
		{127, `exec: "nope": executable file not found in $PATH`, 127},
		{1, `executable file not found`, 1},
	} {
		if got := startExitCode(tc.code, tc.msg); got != tc.want {
			t.Errorf("startExitCode(%d, %q) = %d, want %d", tc.code, tc.msg, got, tc.want)
		}
	}
}
