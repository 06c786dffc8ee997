package hostsock

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// ServeRepair is the TCP_REPAIR helper's side of the protocol (the program
// is cmd/vunet-repair; tests run it in-process): on c, connected to the
// daemon's repair socket, it answers requests until the daemon closes the
// connection (nil) or a request is refused (the error: anything but TCP
// sockets, another value than RepairOn, RepairOff or RepairOffNoWP, a
// truncated message, a failing setsockopt). It touches nothing but the
// sockets it is sent, and only TCP_REPAIR; it closes them after each
// request.
func ServeRepair(c *net.UnixConn) error {
	oob := make([]byte, unix.CmsgSpace(4*RepairBatch))
	var b [1]byte
	for {
		n, oobn, flags, _, err := c.ReadMsgUnix(b[:], oob)
		fds := parseRights(oob[:oobn])
		if n == 0 && len(fds) == 0 {
			return nil // the daemon closed the connection
		}
		if err == nil && flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
			err = errors.New("message truncated")
		}
		if err == nil {
			err = setRepair(fds, int8(b[0]))
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

// setRepair sets TCP_REPAIR to v on every socket of fds, all of which must
// be TCP sockets.
func setRepair(fds []int, v int8) error {
	if len(fds) == 0 {
		return errors.New("request without sockets")
	}
	if v != RepairOn && v != RepairOff && v != RepairOffNoWP {
		return fmt.Errorf("TCP_REPAIR value %d", v)
	}
	for _, fd := range fds {
		typ, proto, err := SocketKind(fd)
		if err != nil || typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP {
			return fmt.Errorf("descriptor is not a TCP socket")
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, int(v)); err != nil {
			return fmt.Errorf("TCP_REPAIR %d: %w", v, err)
		}
	}
	return nil
}

func parseRights(oob []byte) []int {
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
