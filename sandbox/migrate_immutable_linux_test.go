package sandbox_test

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fsImmutableFL is FS_IMMUTABLE_FL from linux/fs.h.
const fsImmutableFL = 0x10

// mgImmutable sets or clears the immutable attribute of path (what
// `chattr +i` does): even root can then neither rename, link nor remove
// it. It fails where the filesystem or the process cannot do that.
func mgImmutable(path string, on bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return fmt.Errorf("FS_IOC_GETFLAGS %s: %w", path, err)
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		return fmt.Errorf("FS_IOC_SETFLAGS %s: %w", path, err)
	}
	return nil
}
