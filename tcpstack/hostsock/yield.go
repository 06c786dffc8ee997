package hostsock

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Yielder hands a goroutine's P to the Go scheduler until the scheduler
// has polled the network.
//
// An event loop that holds its P through its waits (WaitHeld), with
// GOMAXPROCS equal to the number of loops (tcpstack/loop_wait.go says
// why), leaves the rest of the process no P of its own: the control plane
// runs while a loop yields. runtime.Gosched is a yield, but not for a
// goroutine waiting for a socket: the scheduler takes a runnable goroutine
// (the loop itself) before it polls the network, so that goroutine waits
// for the runtime's monitor thread to poll, every 10 ms at best. Yield
// parks on an eventfd of its own in the netpoller, made readable just
// before: the scheduler polls the network to wake the loop again, and
// everything the poll found ready becomes runnable with it.
//
// A Yielder belongs to one goroutine.
type Yielder struct {
	file     *os.File // the eventfd, registered with the netpoller
	raw      syscall.RawConn
	fd       int
	pollable bool // false: the netpoller refused the eventfd; Yield does nothing
	armed    bool // this Yield wrote to the eventfd
	once     func(uintptr) bool
}

// NewYielder makes a Yielder; Close releases its eventfd.
func NewYielder() (*Yielder, error) {
	// os.NewFile puts a descriptor in the netpoller only if it is
	// non-blocking.
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("yield eventfd: %w", err)
	}
	y := &Yielder{file: os.NewFile(uintptr(fd), "yield"), fd: fd}
	if y.raw, err = y.file.SyscallConn(); err != nil {
		y.file.Close()
		return nil, fmt.Errorf("yield eventfd raw conn: %w", err)
	}
	// Deadlines work exactly on descriptors in the netpoller.
	y.pollable = y.file.SetReadDeadline(time.Time{}) == nil
	y.once = y.step // bound once: a method value made per Yield would allocate
	return y, nil
}

// step is RawRead's callback: on the first call (after RawRead reset the
// netpoller's state for the fd, so the edge the write makes cannot be
// lost) it makes the eventfd readable and asks to wait; on the second,
// which comes once the netpoller reported it readable, it empties it.
func (y *Yielder) step(uintptr) bool {
	var b [8]byte
	if y.armed {
		unix.RawSyscall(unix.SYS_READ, uintptr(y.fd), uintptr(unsafe.Pointer(&b[0])), 8)
		return true
	}
	b[0] = 1
	if _, _, errno := unix.RawSyscall(unix.SYS_WRITE, uintptr(y.fd), uintptr(unsafe.Pointer(&b[0])), 8); errno != 0 {
		return true // cannot happen below the counter's limit; nothing to wait for
	}
	y.armed = true
	return false
}

// Yield parks the goroutine until the scheduler has polled the network,
// which readies whatever waited for a ready descriptor; the caller lets
// those run first with runtime.Gosched. Where the netpoller refused the
// eventfd, Yield does nothing.
func (y *Yielder) Yield() error {
	if !y.pollable {
		return nil
	}
	y.armed = false
	if err := y.raw.Read(y.once); err != nil {
		return fmt.Errorf("yield through the netpoller: %w", err)
	}
	return nil
}

// Close releases the eventfd (through the File, which takes it out of the
// netpoller first). Closing a nil Yielder does nothing.
func (y *Yielder) Close() error {
	if y == nil || y.file == nil {
		return nil
	}
	err := y.file.Close()
	y.file = nil
	return err
}
