package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Socket activation (sd_listen_fds(3)): systemd, or systemd-socket-activate,
// binds the listening socket itself and starts vunet with it as descriptor
// 3, saying so in LISTEN_PID (this process) and LISTEN_FDS (how many).
// vunet then serves that socket instead of creating one: QEMU can connect
// before vunet runs, and the socket outlives a restart of vunet.
const (
	listenFDsStart = 3
	listenPIDEnv   = "LISTEN_PID"
	listenFDsEnv   = "LISTEN_FDS"
	listenNamesEnv = "LISTEN_FDNAMES"
)

// activationFDs returns the descriptors passed for socket activation, none
// when the variables are unset or name another process (a child that
// inherited them by mistake).
func activationFDs(getenv func(string) string, pid int) ([]int, error) {
	pidStr, nStr := getenv(listenPIDEnv), getenv(listenFDsEnv)
	if pidStr == "" || nStr == "" {
		return nil, nil
	}
	if p, err := strconv.Atoi(pidStr); err != nil || p != pid {
		return nil, nil
	}
	n, err := strconv.Atoi(nStr)
	if err != nil || n < 0 || n > 1024 {
		return nil, fmt.Errorf("%s=%q: not a descriptor count", listenFDsEnv, nStr)
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = listenFDsStart + i
	}
	return fds, nil
}

// socketActivation returns the socket systemd passed for --socket, nil when
// vunet is to make its own (or serves in another mode).
func socketActivation(o *options) (*net.UnixListener, error) {
	if o.socket == "" {
		return nil, nil
	}
	return activatedListener(o.socket)
}

// activatedListener returns the listening UNIX stream socket passed by
// socket activation, nil when nothing was passed. When path is set
// (--socket), the passed socket must be bound to it: a unit whose
// ListenStream= and --socket disagree is a mistake to report, not to paper
// over. The variables are removed from the environment so that nothing
// vunet starts takes the socket for its own.
func activatedListener(path string) (*net.UnixListener, error) {
	fds, err := activationFDs(os.Getenv, os.Getpid())
	for _, v := range []string{listenPIDEnv, listenFDsEnv, listenNamesEnv} {
		os.Unsetenv(v)
	}
	if err != nil || len(fds) == 0 {
		return nil, err
	}
	return listenerFromFDs(fds, path)
}

// listenerFromFDs picks the one vhost-user socket among fds and closes the
// rest (vunet serves one socket).
func listenerFromFDs(fds []int, path string) (*net.UnixListener, error) {
	var l *net.UnixListener
	var errs []error
	for _, fd := range fds {
		unix.CloseOnExec(fd)
		got, err := unixListener(fd)
		switch {
		case err != nil:
			errs = append(errs, err)
		case l != nil:
			errs = append(errs, fmt.Errorf("socket activation: more than one listening socket passed (%s, %s); vunet serves one",
				l.Addr(), got.Addr()))
			got.Close()
		default:
			l = got
		}
	}
	if err := errors.Join(errs...); err != nil {
		if l != nil {
			l.Close()
		}
		return nil, err
	}
	if path != "" && !samePath(l.Addr().String(), path) {
		err := fmt.Errorf("socket activation: the passed socket is bound to %q, --socket says %q", l.Addr(), path)
		l.Close()
		return nil, err
	}
	// The socket file is systemd's: it made it with the .socket unit's
	// SocketMode=, and it removes it. vunet must not.
	l.SetUnlinkOnClose(false)
	return l, nil
}

// unixListener takes over fd if it is a listening AF_UNIX stream socket.
func unixListener(fd int) (*net.UnixListener, error) {
	domain, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	listening, err3 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err := errors.Join(err1, err2, err3); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("socket activation: descriptor %d is not a socket: %w", fd, err)
	}
	if domain != unix.AF_UNIX || typ != unix.SOCK_STREAM || listening != 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("socket activation: descriptor %d is not a listening UNIX stream socket (ListenStream=PATH)", fd)
	}
	f := os.NewFile(uintptr(fd), "systemd-socket")
	defer f.Close() // FileListener holds its own (close-on-exec) copy
	fl, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("socket activation: descriptor %d: %w", fd, err)
	}
	return fl.(*net.UnixListener), nil
}

// samePath compares a socket's bound path with --socket's, after making
// both absolute and clean (systemd binds the unit's absolute path).
func samePath(a, b string) bool {
	ca, err1 := filepath.Abs(a)
	cb, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && ca == cb
}
