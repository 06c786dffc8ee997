package vhostuser

import (
	"fmt"
	"net"
	"os"
)

// ListenSocket listens on a new socket file at path by Serve's rules, for
// a server of another protocol on the same kind of socket (vunet's stream
// transport): a stale socket file is replaced and a live one refused
// (ErrSocketInUse), the file's permissions are exactly mode (0: 0600)
// from the start. remove deletes the file if it is still the one made
// here; the listener does not.
func ListenSocket(path string, mode os.FileMode) (l *net.UnixListener, remove func(), err error) {
	mode = mode.Perm()
	if mode == 0 {
		mode = 0o600
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if l, err = listenUnix(path, mode); err != nil {
		return nil, nil, err
	}
	created, _ := os.Lstat(path)
	remove = func() { removeOurSocket(path, created) }
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		remove()
		return nil, nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, remove, nil
}
