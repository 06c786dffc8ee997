package hostsock

import (
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// With GOMAXPROCS 1 and the only P held, a goroutine waiting for a socket
// runs once the holder yields through the Yielder: the scheduler polls the
// network on the way (runtime.Gosched alone takes the runnable holder
// first, and the reader waits for sysmon).
func TestYieldLetsTheNetpollerRun(t *testing.T) {
	old := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	y, err := NewYielder()
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "control")
	conn, err := net.FileConn(f) // a duplicate, in the netpoller
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for round := 1; round <= 3; round++ {
		var read atomic.Bool
		started := make(chan struct{})
		go func() {
			close(started)
			var b [1]byte
			if n, _ := conn.Read(b[:]); n == 1 && b[0] == byte(round) {
				read.Store(true)
			}
		}()
		<-started
		runtime.Gosched() // the reader parks in conn.Read
		// Written without passing through the scheduler, as a loop's own
		// system calls are.
		b := []byte{byte(round)}
		if _, _, errno := unix.RawSyscall(unix.SYS_WRITE, uintptr(fds[1]), uintptr(unsafe.Pointer(&b[0])), 1); errno != 0 {
			t.Fatalf("write: %v", errno)
		}
		if err := y.Yield(); err != nil {
			t.Fatal(err)
		}
		// What the poll readied runs before the yielder; a few passes, as
		// the runtime's own goroutines (a GC worker) may come first (once
		// in CI under load). Gosched alone does not poll the network.
		for i := 0; i < 4 && !read.Load(); i++ {
			runtime.Gosched()
		}
		if !read.Load() {
			t.Fatalf("round %d: the socket's reader did not run during the yield", round)
		}
	}
	// The eventfd is empty again after each yield.
	var buf [8]byte
	if _, err := unix.Read(y.fd, buf[:]); err != unix.EAGAIN {
		t.Fatalf("yield eventfd after the yields: read %v, want EAGAIN", err)
	}
}

// Yield runs on the loops' path: it allocates nothing.
func TestYieldAllocatesNothing(t *testing.T) {
	y, err := NewYielder()
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	if a := testing.AllocsPerRun(200, func() { y.Yield() }); a != 0 {
		t.Fatalf("%v allocations per Yield, want 0", a)
	}
}

// BenchmarkYield is the cost of one hand-over through the netpoller.
func BenchmarkYield(b *testing.B) {
	y, err := NewYielder()
	if err != nil {
		b.Fatal(err)
	}
	defer y.Close()
	b.ReportAllocs()
	for b.Loop() {
		y.Yield()
	}
}
