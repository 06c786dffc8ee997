package main

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/test/testenv"
)

// pair returns the daemon's end and a channel with serve's result on the
// helper's end of a UNIX stream socket pair.
func pair(t *testing.T) (*net.UnixConn, <-chan error) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "repair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	daemon, helper := conn(fds[0]), conn(fds[1])
	done := make(chan error, 1)
	go func() { done <- hostsock.ServeRepair(helper); helper.Close() }()
	t.Cleanup(func() { daemon.Close() })
	return daemon, done
}

func tcpSocket(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// repairOn reports whether fd is in repair mode: in repair mode a socket
// accepts TCP_QUEUE_SEQ, outside it refuses it (EPERM).
func repairOn(fd int) bool {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, 1) == nil
}

func request(t *testing.T, c *net.UnixConn, v int8, fds ...int) (answer int8, ok bool) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix([]byte{byte(v)}, oob, nil); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	n, err := c.Read(b[:])
	return int8(b[0]), n == 1 && err == nil
}

// TestRepairOnAndOff: the helper sets and clears repair mode on the
// sockets it is sent, and answers with the request's byte.
func TestRepairOnAndOff(t *testing.T) {
	testenv.NeedRoot(t, "TCP_REPAIR needs CAP_NET_ADMIN")
	c, _ := pair(t)
	a, b := tcpSocket(t), tcpSocket(t)
	if repairOn(a) || repairOn(b) {
		t.Fatal("new sockets in repair mode")
	}
	if v, ok := request(t, c, 1, a, b); !ok || v != 1 {
		t.Fatalf("answer %d %v", v, ok)
	}
	if !repairOn(a) || !repairOn(b) {
		t.Fatal("repair mode not set")
	}
	if v, ok := request(t, c, -1, a); !ok || v != -1 {
		t.Fatalf("answer %d %v", v, ok)
	}
	if repairOn(a) || !repairOn(b) {
		t.Fatal("repair mode not cleared on exactly the socket sent")
	}
}

// TestRepairRefuses: anything but TCP sockets and the three values ends
// the session with an error, and nothing is changed.
func TestRepairRefuses(t *testing.T) {
	testenv.NeedRoot(t, "TCP_REPAIR needs CAP_NET_ADMIN")
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	for _, tc := range []struct {
		name string
		v    int8
		fds  []int
	}{
		{"pipe", 1, []int{p[0]}},
		{"UDP socket", 1, []int{udp}},
		{"other value", 5, []int{tcpSocket(t)}},
		{"no sockets", 1, nil},
	} {
		c, done := pair(t)
		if _, ok := request(t, c, tc.v, tc.fds...); ok {
			t.Errorf("%s: answered", tc.name)
		}
		if err := <-done; err == nil {
			t.Errorf("%s: served without an error", tc.name)
		}
	}
	// A session the daemon ends is a clean exit.
	c, done := pair(t)
	c.Close()
	if err := <-done; err != nil {
		t.Errorf("daemon hung up: %v", err)
	}
}
