package tcp

// The kernel features a table depends on, probed once per process:
// SO_PEEK_OFF per address family (without it, already-sent bytes are
// peeked into a discard buffer) and the window experiment.

import (
	"sync"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
)

// windowProbeLog says once per process what the window probe found.
var windowProbeLog sync.Once

// ProbeKernel runs now, once per process, the kernel probes tables built
// with cfg depend on (SO_PEEK_OFF per address family; the window
// experiment unless cfg.NoWindowClamp), so that a daemon runs them at
// start-up, before it confines itself, instead of at its first queue
// pair start.
func ProbeKernel(cfg Config) {
	if !cfg.NoPeekOffset {
		hostsock.PeekOffsetSupported(false)
		hostsock.PeekOffsetSupported(true)
	}
	if !cfg.NoWindowClamp {
		hostsock.ProbeWindowKernel()
	}
}

// usePeekOffset starts f's socket reading at SO_PEEK_OFF when its family
// has it (f.peekOff), and otherwise leaves f on the discard-buffer
// fallback: a family whose probe failed, or a socket that refuses it all
// the same, costs a copy per peek, never the connection.
func (t *Table) usePeekOffset(f *conn) {
	f.peekOff = false
	fam := 0
	// A socket we dialled has the family of the address we dialled: no
	// getsockopt(SO_DOMAIN) for it, one system call less per connection.
	if f.dialled && f.dialV6 || !f.dialled && hostsock.SocketIsIPv6(f.fd) {
		fam = 1
	}
	if !t.peekOff[fam] {
		return
	}
	if err := t.setPeekOff(f.fd, 0); err != nil {
		t.log.Debug("tcp SO_PEEK_OFF refused: discard-buffer fallback for this connection", "err", err)
		return
	}
	f.peekOff = true
}

// inlineUrgent sets SO_OOBINLINE on a connection's socket: a host peer's
// urgent byte (MSG_OOB) stays in its place in the stream. Out of line, the
// kernel takes it out of the data the peek reads, which the guest, who
// sees only the stream, would never get, and around which the peek offset
// went wrong. A refusal is harmless for any other data: the byte is then
// lost as before.
func inlineUrgent(fd int) {
	_ = hostsock.SetInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1)
}

// discardBuf returns the fallback's discard buffer, allocated on first
// use where every family had SO_PEEK_OFF.
func (t *Table) discardBuf() []byte {
	if t.discard == nil {
		t.discard = make([]byte, maxWindow)
	}
	return t.discard
}
