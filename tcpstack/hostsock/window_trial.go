package hostsock

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The window experiment: what this kernel does when a guest ACK lets vunet
// drop data from a host socket whose receive window a remote sender has
// filled. It runs vunet's own sequence on a loopback pair — the receiving
// socket dialled and tuned as DialTCP does, its data peeked (MSG_PEEK, at
// SO_PEEK_OFF where the kernel has it), then dropped with Discard and, by
// mode, the workaround applied with ReapplyWindowClamp — and measures what
// the remote sender is then allowed to send. ProbeWindowKernel runs it once
// per process to decide whether the daemon applies the workaround; the
// tests run it on the host kernel and inside a QEMU guest.

// WindowMode is what the experiment does around the consume.
type WindowMode uint8

const (
	// WindowAlone: consume only; what the kernel does by itself.
	WindowAlone WindowMode = iota
	// WindowClampAfter: consume, then the workaround (the daemon's form).
	WindowClampAfter
	// WindowClampAtZero: the workaround while the window is still zero,
	// then the consume: the form that locks the window on kernels from
	// 5.15 to the 2023 fix.
	WindowClampAtZero
)

func (m WindowMode) String() string {
	switch m {
	case WindowAlone:
		return "alone"
	case WindowClampAfter:
		return "clamp-after"
	case WindowClampAtZero:
		return "clamp-at-zero"
	}
	return fmt.Sprintf("mode%d", uint8(m))
}

// WindowTrial is one run of the window experiment.
type WindowTrial struct {
	Mode WindowMode
	// Filled is what the receiving socket held when the sender's window
	// closed, all of it peeked and then consumed (a guest ACK of
	// everything in flight).
	Filled int
	// Clamp is what the workaround did (ClampSkipped in WindowAlone).
	Clamp ClampOutcome
	// Reopened is the window the remote sender was then offered
	// (its tcpi_snd_wnd), 0 if it stayed shut for the whole settle time.
	Reopened uint32
	// Delivered is how much of a Reopened-sized write the sender then
	// got into the receiving socket within the settle time.
	Delivered int
}

func (w WindowTrial) String() string {
	return fmt.Sprintf("%s: filled %d, clamp %v, sender window %d, delivered %d",
		w.Mode, w.Filled, w.Clamp, w.Reopened, w.Delivered)
}

// trialStep bounds each wait of a trial: the listener's accept and the
// filling of the window.
const trialStep = 5 * time.Second

// RunWindowTrial runs the window experiment once, on 127.0.0.1, waiting
// up to settle for the sender's window to reopen and for the data it may
// then send.
func RunWindowTrial(mode WindowMode, settle time.Duration) (WindowTrial, error) {
	w := WindowTrial{Mode: mode}
	s, r, err := loopbackPair()
	if err != nil {
		return w, err
	}
	defer unix.Close(s)
	defer unix.Close(r)
	var info unix.TCPInfo
	if w.Filled, err = fillWindow(s, &info); err != nil {
		return w, err
	}
	// The data goes to the guest: peeked, and kept.
	if PeekOffsetSupported(false) {
		if err := SetPeekOffset(r, 0); err != nil {
			return w, fmt.Errorf("SO_PEEK_OFF: %w", err)
		}
	}
	var io IO
	buf := make([]byte, w.Filled)
	if n, err := io.Peek(r, [][]byte{buf}); err != nil || n != w.Filled {
		return w, fmt.Errorf("peek %d of %d bytes: %v", n, w.Filled, err)
	}
	// The guest ACKs all of it.
	if mode == WindowClampAtZero {
		_, w.Clamp = ReapplyWindowClamp(r, &info)
	}
	if n, err := Discard(r, w.Filled); err != nil || n != w.Filled {
		return w, fmt.Errorf("consume %d of %d bytes: %v", n, w.Filled, err)
	}
	if mode == WindowClampAfter {
		_, w.Clamp = ReapplyWindowClamp(r, &info)
	}
	deadline := time.Now().Add(settle)
	for {
		if TCPInfo(s, &info) && info.Snd_wnd > 0 {
			w.Reopened = info.Snd_wnd
			break
		}
		if time.Now().After(deadline) {
			return w, nil
		}
		time.Sleep(time.Millisecond)
	}
	// What the sender can now send, it sends.
	out := make([]byte, w.Reopened)
	sent := 0
	for sent < len(out) && time.Now().Before(deadline) {
		n, err := unix.Write(s, out[sent:])
		if n > 0 {
			sent += n
			continue
		}
		if err != nil && err != unix.EAGAIN {
			return w, fmt.Errorf("sender write: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
	for {
		q, _ := ioctlInt(r, unix.SIOCINQ)
		w.Delivered = q
		if q >= sent || time.Now().After(deadline) {
			return w, nil
		}
		time.Sleep(time.Millisecond)
	}
}

// loopbackPair returns a connected loopback TCP pair, both ends
// non-blocking: s the remote sender (accepted), r the socket vunet opens
// (DialTCP, tuned as every translated socket is).
func loopbackPair() (s, r int, err error) {
	ln, port, err := ListenTCP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		return -1, -1, fmt.Errorf("window trial listener: %w", err)
	}
	defer unix.Close(ln)
	r, _, err = DialTCP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Source{}, 0, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("window trial connect: %w", err)
	}
	deadline := time.Now().Add(trialStep)
	for {
		fd, _, err := Accept(ln)
		if err == nil {
			return fd, r, nil
		}
		if !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			unix.Close(r)
			return -1, -1, fmt.Errorf("window trial accept: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// fillWindow writes from s exactly what its peer's window takes until the
// window is zero and nothing is left unsent or unacknowledged, so that the
// window reopened later is the sender's to use, and returns the bytes
// written. The window and what is still queued come from one TCP_INFO
// snapshot (tcpi_snd_wnd, tcpi_bytes_acked): read apart, an ACK between
// them would make the room look larger than it is.
func fillWindow(s int, info *unix.TCPInfo) (int, error) {
	chunk := make([]byte, 64<<10)
	total := 0
	if !TCPInfo(s, info) {
		return 0, errors.New("window trial: TCP_INFO")
	}
	acked0 := info.Bytes_acked
	deadline := time.Now().Add(trialStep)
	for {
		if !TCPInfo(s, info) {
			return total, errors.New("window trial: TCP_INFO")
		}
		queued := total - int(info.Bytes_acked-acked0)
		if info.Snd_wnd == 0 && queued == 0 {
			return total, nil
		}
		if room := int(info.Snd_wnd) - queued; room > 0 {
			if n, _ := unix.Write(s, chunk[:min(room, len(chunk))]); n > 0 {
				total += n
				continue
			}
		}
		if time.Now().After(deadline) {
			return total, fmt.Errorf("window trial: window %d, %d bytes queued after %d", info.Snd_wnd, queued, total)
		}
		time.Sleep(time.Millisecond)
	}
}

// WindowKernel is what ProbeWindowKernel found about this kernel.
type WindowKernel struct {
	// Err is why the experiment could not run (no loopback, say); the
	// workaround is then not applied.
	Err error
	// Alone is the consume without the workaround; Clamp the consume
	// with it, run only when Alone did not reopen the window.
	Alone, Clamp WindowTrial
}

// NeedsClamp reports whether the daemon should apply the workaround: the
// consume alone leaves the sender's window shut and the clamp after it
// reopens it. Everywhere else it is a no-op at best.
func (k WindowKernel) NeedsClamp() bool {
	return k.Err == nil && k.Alone.Reopened == 0 && k.Clamp.Reopened > 0
}

func (k WindowKernel) String() string {
	if k.Err != nil {
		return "not probed: " + k.Err.Error()
	}
	if k.Alone.Reopened > 0 {
		return fmt.Sprintf("the kernel reopens the window by itself (%v)", k.Alone)
	}
	return fmt.Sprintf("the kernel leaves the window shut (%v); with the clamp: %v", k.Alone, k.Clamp)
}

// probeSettle is how long the probe waits for a window to reopen. A
// window left shut would reopen only with the sender's zero-window probe,
// 200 ms at the earliest.
const probeSettle = 150 * time.Millisecond

var windowKernel struct {
	once sync.Once
	k    WindowKernel
}

// ProbeWindowKernel runs the window experiment once per process and
// returns what it found.
func ProbeWindowKernel() WindowKernel {
	windowKernel.once.Do(func() {
		k := &windowKernel.k
		if k.Alone, k.Err = RunWindowTrial(WindowAlone, probeSettle); k.Err != nil || k.Alone.Reopened > 0 {
			return
		}
		k.Clamp, k.Err = RunWindowTrial(WindowClampAfter, probeSettle)
	})
	return windowKernel.k
}
