// Command vunet-repair is the privileged helper that sets and clears
// TCP_REPAIR on TCP sockets for vunet, which never holds the capability
// (CAP_NET_ADMIN) that repair mode needs: with it, a migrated guest's TCP
// connections can be read out of their sockets and recreated elsewhere.
//
// Usage:
//
//	vunet-repair PATH
//
// It connects to the daemon's repair socket at PATH (vunet's
// --repair-path) and serves until the daemon closes the connection: each
// message is one signed byte, TCP_REPAIR_ON (1), TCP_REPAIR_OFF (0) or
// TCP_REPAIR_OFF_NO_WP (-1), with 1 to 253 sockets as SCM_RIGHTS; it sets
// TCP_REPAIR to that value on each and answers with the same byte. On any
// failure — a descriptor that is not a TCP socket, another value, a
// truncated message — it closes the connection and exits 1. This is
// passt-repair's protocol: either helper serves either daemon.
//
// It does nothing else: it opens nothing, touches only the sockets it is
// given, and only that one option. Grant it CAP_NET_ADMIN (setcap
// cap_net_admin+ep) rather than running it as root.
package main

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: vunet-repair PATH\n\nSets TCP_REPAIR on the sockets the vunet daemon listening at PATH (--repair-path) sends.")
		os.Exit(2)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Args[1], Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "vunet-repair:", err)
		os.Exit(1)
	}
	defer c.Close()
	if err := serve(c); err != nil {
		fmt.Fprintln(os.Stderr, "vunet-repair:", err)
		os.Exit(1)
	}
}

// maxFDs is SCM_MAX_FD, the most sockets one message carries.
const maxFDs = 253

// serve answers the daemon's requests on c until it closes the connection
// (nil) or a request fails (the error).
func serve(c *net.UnixConn) error {
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	var b [1]byte
	for {
		n, oobn, flags, _, err := c.ReadMsgUnix(b[:], oob)
		fds := rights(oob[:oobn])
		if n == 0 && len(fds) == 0 {
			return nil // the daemon closed the connection
		}
		if err == nil && flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
			err = errors.New("message truncated")
		}
		if err == nil {
			err = apply(fds, int8(b[0]))
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			return err
		}
		if _, err := c.Write(b[:]); err != nil {
			return err
		}
	}
}

// apply sets TCP_REPAIR to v on every socket of fds, all of which must be
// TCP sockets.
func apply(fds []int, v int8) error {
	if len(fds) == 0 {
		return errors.New("request without sockets")
	}
	if v != unix.TCP_REPAIR_ON && v != unix.TCP_REPAIR_OFF && v != unix.TCP_REPAIR_OFF_NO_WP {
		return fmt.Errorf("TCP_REPAIR value %d", v)
	}
	for _, fd := range fds {
		typ, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
		proto, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
		if err1 != nil || err2 != nil || typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP {
			return fmt.Errorf("descriptor is not a TCP socket")
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, int(v)); err != nil {
			return fmt.Errorf("TCP_REPAIR %d: %w", v, err)
		}
	}
	return nil
}

func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}
