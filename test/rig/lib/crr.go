package rig

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// ConnectExchangeClose opens a TCP connection to addr, sends one byte,
// reads one byte back and closes the connection (client first, so the
// TIME_WAIT is the client's), with blocking system calls on the calling
// thread, each bounded by timeout. Run in a namespace (InGuest), it is one
// transaction of a connection-rate test, as netperf's TCP_CRR makes it.
//
// Blocking calls, not Go's net package: the caller runs on a thread locked
// in a namespace, and a locked goroutine that waits in Go's netpoller pays
// two thread hand-offs per wait (the thread that finds it ready must hand
// its P to the locked one). The paths with more waits per connection (the
// rig's, whose handshake replies come from other threads) paid more of
// them: the bench's connection rate through the rig alone came out at
// 660–1,290/s with the locked netpoller client, 2,800–3,250/s with one
// dial per thread. A blocking call sleeps in the kernel and is woken by it
// directly, like a guest program's.
func ConnectExchangeClose(addr netip.AddrPort, timeout time.Duration) error {
	if !addr.Addr().Is4() {
		return fmt.Errorf("connect %v: IPv4 only", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return fmt.Errorf("setsockopt: %w", err)
		}
	}
	sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	for {
		// With a send timeout set, a signal ends a blocking connect with
		// EINTR; connecting again waits for the handshake under way.
		err = unix.Connect(fd, sa)
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EALREADY) {
			break
		}
	}
	if err != nil && !errors.Is(err, unix.EISCONN) {
		return fmt.Errorf("connect %v: %w", addr, err)
	}
	b := []byte{1}
	if err := retryEINTR(func() (int, error) { return unix.Write(fd, b) }); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := retryEINTR(func() (int, error) { return unix.Read(fd, b) }); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

// retryEINTR runs a 1-byte read or write until it moved the byte; EAGAIN
// (the socket's timeout) and end of file are errors.
func retryEINTR(io func() (int, error)) error {
	for {
		n, err := io()
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return errors.New("timed out")
		case err != nil:
			return err
		case n == 0:
			return errors.New("connection closed by the peer")
		}
		return nil
	}
}
