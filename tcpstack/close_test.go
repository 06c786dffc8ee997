package tcpstack

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoLoopStartsAfterClose: once Close began, neither a queue pair nor a
// stream session starts a loop: one started after Close stopped the running
// ones would run on over the tables Close is closing (a stream session
// that a new connection started during Close did, under -race).
func TestNoLoopStartsAfterClose(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.s.Close()
	if err := p.s.StartPair(p.qp); !errors.Is(err, ErrClosed) {
		t.Fatalf("StartPair after Close: %v, want ErrClosed", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := p.s.ServeStream(context.Background(), fds[0]); !errors.Is(err, ErrClosed) {
		t.Fatalf("ServeStream after Close: %v, want ErrClosed", err)
	}
}
