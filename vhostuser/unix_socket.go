package vhostuser

import (
	"net"
	"os"
)

// ListenUnix listens on a new UNIX socket file at path the way the
// vhost-user server does, for vunet's other sockets (the control
// endpoint): a stale socket file nobody listens on is replaced, a live one
// (ErrSocketInUse) or a file of another kind is refused, and the file's
// permissions are never wider than mode. remove deletes the file if it is
// still the one created (a successor that replaced it keeps its own).
func ListenUnix(path string, mode os.FileMode) (l *net.UnixListener, remove func(), err error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, nil, err
	}
	l, err = listenUnix(path, mode)
	if err != nil {
		return nil, nil, err
	}
	created, _ := os.Lstat(path)
	return l, func() { removeOurSocket(path, created) }, nil
}

// PeerCred returns the process ID, user and group of the peer of a UNIX
// connection (SO_PEERCRED); -1 each when unknown.
func PeerCred(c *net.UnixConn) (pid, uid, gid int) { return peerCred(c) }
