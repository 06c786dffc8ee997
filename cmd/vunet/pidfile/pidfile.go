// Package pidfile writes --pid files safely: a new file in the target's
// directory, renamed over the target. Nothing at the target (a stale file
// from a crash, a symbolic link planted there) is opened or followed, and
// a reader never sees a partial file.
package pidfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Write writes pid and a newline to path, mode 0644.
func Write(path string, pid int) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// CreateTemp opens with O_CREATE|O_EXCL: it never follows a link.
	f, err := os.CreateTemp(dir, "."+base+".*")
	if err != nil {
		return fmt.Errorf("--pid %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.WriteString(strconv.Itoa(pid) + "\n")
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// rename replaces a link at path; it does not write through it.
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--pid %s: %w", path, err)
	}
	return nil
}
