package hostsock

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLongCallsKeepTheirThread holds the raw data-path calls to their
// effect (raw_syscall.go): a goroutine that moves megabytes a call, with
// GOMAXPROCS 1 as for one loop, stays on its thread. Made through the
// scheduler, calls this long lose the P to sysmon, and the goroutine comes
// back on another thread (measured with unix.Syscall in Recv and Send: 2
// to 46 moves in 200 ms of 4 MB calls, 28 of 28 runs, by two people; 256
// KB calls for 20 ms moved it 1-2 times, too few to rely on).
func TestLongCallsKeepTheirThread(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	const size = 4 << 20
	for _, fd := range fds {
		// Room for a whole message in flight (root may exceed wmem_max).
		if err := SetInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2*size); err != nil {
			_ = SetInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 2*size)
		}
	}
	out := bytes.Repeat([]byte{0xa5}, size)
	in := make([]byte, size)
	var s IO
	tid, moves, calls, moved := unix.Gettid(), 0, 0, 0
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
		sent, err := s.Send(fds[0], [][]byte{out}, 0, size)
		if err != nil {
			t.Fatalf("send after %d calls: %v", calls, err)
		}
		calls++
		for got := 0; got < sent; {
			n, _, err := s.Recv(fds[1], [][]byte{in[got:sent]}, 0)
			if err != nil {
				t.Fatalf("recv after %d calls, %d of %d bytes: %v", calls, got, sent, err)
			}
			calls++
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
		t.Errorf("the goroutine changed threads %d times in %d calls (%d MB moved): a long call lost its P", moves, calls, moved>>20)
	}
}
