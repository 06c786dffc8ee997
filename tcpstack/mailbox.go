package tcpstack

import (
	"encoding/binary"
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/dgram"
)

// A pair's mailbox: how the loops of other queue pairs ask it for a flow
// and hand it flows (moves.go), without a lock. Any goroutine posts; one
// reads at a time (the pair's loop, or the control path while no loop
// runs). It is a bounded multi-producer queue of fixed cells, each with a
// sequence number that says whose turn the cell is (Dmitry Vyukov's
// bounded MPMC queue, used with one consumer); an eventfd that outlives the
// pair's loops wakes the reader.

// mailboxSize is how many messages wait at most; a post to a full box
// fails (the poster copes: a request is dropped with its frame, a flow is
// taken back).
const mailboxSize = 256

// moveOp is what a message says.
type moveOp uint8

const (
	moveWant moveOp = iota + 1 // from asks for the flow fp
	moveGive                   // the flow fp: its state and its socket, now the reader's
	moveNone                   // from does not hold fp (any more)
)

// moveKind says which table a flow belongs to.
type moveKind uint8

const (
	moveTCP   moveKind = iota + 1 // tcp.Table
	moveDgram                     // dgram.Table: UDP flows, ICMP echo
)

// moveMsg is one message between pairs.
type moveMsg struct {
	op    moveOp
	kind  moveKind
	from  int // the sender's pair index
	fp    uint64
	state []byte // moveGive: the encoded flow (TCP)
	fd    int    // moveGive: the flow's socket
	// moveGive of a datagram flow: its state, carried in the message so
	// that a move allocates nothing (the mailbox copies messages by
	// value).
	dgram [dgram.StateSize]byte
}

type mailCell struct {
	seq atomic.Uint64
	msg moveMsg
}

type mailbox struct {
	cells [mailboxSize]mailCell
	head  atomic.Uint64 // next cell to fill
	tail  atomic.Uint64 // next cell to read (one reader at a time)
	wake  int           // eventfd, readable while messages may wait
}

func newMailbox() (*mailbox, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	m := &mailbox{wake: fd}
	for i := range m.cells {
		m.cells[i].seq.Store(uint64(i))
	}
	return m, nil
}

// post queues msg and wakes the reader; false when the box is full.
func (m *mailbox) post(msg moveMsg) bool {
	pos := m.head.Load()
	for {
		c := &m.cells[pos%mailboxSize]
		seq := c.seq.Load()
		switch d := int64(seq) - int64(pos); {
		case d == 0:
			if m.head.CompareAndSwap(pos, pos+1) {
				c.msg = msg
				c.seq.Store(pos + 1)
				m.ring()
				return true
			}
			pos = m.head.Load()
		case d < 0:
			return false // full: the reader has not freed this cell yet
		default:
			pos = m.head.Load() // another poster took it
		}
	}
}

// ring makes the eventfd readable.
func (m *mailbox) ring() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	if _, err := unix.Write(m.wake, one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		// The counter cannot overflow in practice; the reader also looks
		// at the box in every iteration that has other work.
		return
	}
}

// pending reports whether a message may wait (a cheap check the loop makes
// every iteration).
func (m *mailbox) pending() bool {
	return m.cells[m.tail.Load()%mailboxSize].seq.Load() == m.tail.Load()+1
}

// take returns the next message, if any.
func (m *mailbox) take() (moveMsg, bool) {
	pos := m.tail.Load()
	c := &m.cells[pos%mailboxSize]
	if c.seq.Load() != pos+1 {
		return moveMsg{}, false
	}
	msg := c.msg
	c.msg = moveMsg{}
	m.tail.Store(pos + 1)
	c.seq.Store(pos + mailboxSize)
	return msg, true
}

// drainWake resets the eventfd (the loop then reads the box).
func (m *mailbox) drainWake() {
	var b [8]byte
	unix.Read(m.wake, b[:])
}

// close closes the eventfd; messages still waiting lose their sockets.
func (m *mailbox) close() {
	for {
		msg, ok := m.take()
		if !ok {
			break
		}
		if msg.op == moveGive && msg.fd >= 0 {
			unix.Close(msg.fd)
		}
	}
	unix.Close(m.wake)
	m.wake = -1
}
