package hostsock

import (
	"bytes"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLongCallsKeepTheirThread holds nowait to its effect: a goroutine
// that moves 256 KB a call, with GOMAXPROCS 1 as for one loop, stays on
// its thread. Through the scheduler's entry points each such call outlasts
// sysmon's 20 µs tick, loses the P to a fresh thread, and the goroutine
// comes back on that other thread (measured here: dozens of moves in 2,000
// calls).
func TestLongCallsKeepTheirThread(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	const size = 256 << 10
	for _, fd := range fds {
		// Room for a whole message in flight each way.
		if err := SetInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4*size); err != nil {
			_ = SetInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4*size)
		}
		if err := SetInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4*size); err != nil {
			_ = SetInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4*size)
		}
	}
	out := bytes.Repeat([]byte{0xa5}, size)
	in := make([]byte, size)
	var s IO
	tid, moves, moved := unix.Gettid(), 0, 0
	for i := 0; i < 1000; i++ {
		sent, err := s.Send(fds[0], [][]byte{out}, 0, size)
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		for got := 0; got < sent; {
			n, _, err := s.Recv(fds[1], [][]byte{in[got:sent]}, 0)
			if err != nil {
				t.Fatalf("recv %d after %d of %d bytes: %v", i, got, sent, err)
			}
			got += n
		}
		if now := unix.Gettid(); now != tid {
			moves++
			tid = now
		}
		moved += sent
	}
	if moved == 0 || in[0] != 0xa5 {
		t.Fatalf("moved %d bytes, first %#x", moved, in[0])
	}
	if moves > 0 {
		t.Errorf("the goroutine changed threads %d times in 2,000 calls of up to 256 KB (%d bytes moved): a long call lost its P", moves, moved)
	}
}
