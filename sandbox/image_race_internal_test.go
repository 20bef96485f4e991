package sandbox

import (
	"errors"
	"fmt"
	"testing"
)

// The engine's wording when a cached parent image vanished mid-build (seen
// in CI on Docker 20.10) is retried; other build failures are not.
func TestCacheRace(t *testing.T) {
	for msg, want := range map[string]bool{
		`step "Step 10/15 : LABEL x=y" failed: failed to get digest sha256:e83f: open /var/lib/docker/image/overlay2/imagedb/content/sha256/e83f: no such file or directory`: true,
		`step "Step 2/5 : RUN apt-get install nope" failed: The command '/bin/sh -c apt-get install nope' returned a non-zero code: 100`:                                     false,
		`Error response from daemon: No such image: sha256:abc`: true,
	} {
		err := fmt.Errorf("build image: %w: %s", ErrBuildFailed, msg)
		if got := cacheRace(err); got != want {
			t.Errorf("cacheRace(%q) = %v, want %v", msg, got, want)
		}
	}
	if cacheRace(errors.New("failed to get digest")) {
		t.Error("an error that is not a build failure counted as a cache race")
	}
}
