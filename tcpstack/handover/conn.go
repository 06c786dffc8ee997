package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Network is the socket type of the hand-over channel.
const Network = "unixpacket"

// StepTimeout bounds every step once an exchange is under way: the
// handshake, each message of a state after the first, and each send.
const StepTimeout = 5 * time.Second

// Conn is one end of a hand-over channel. A Conn is used by one goroutine
// for reading and one for writing at a time.
type Conn struct {
	uc  *net.UnixConn
	buf []byte
	oob []byte
}

func newConn(uc *net.UnixConn) *Conn {
	return &Conn{uc: uc, buf: make([]byte, MaxMessageSize+1), oob: make([]byte, unix.CmsgSpace(4*MaxFDsPerMessage))}
}

// Close closes the channel.
func (c *Conn) Close() error { return c.uc.Close() }

// Dial connects to the source vunet listening at path (the destination's
// --migrate-from, at start-up) and exchanges HELLOs.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, Network, path)
	if err != nil {
		return nil, fmt.Errorf("hand-over: connect to the source at %s: %w", path, err)
	}
	c := newConn(nc.(*net.UnixConn))
	if err := c.send(appendHeader(nil, msgHello, 0, 0), nil); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.expect(msgHello); err != nil {
		c.Close()
		return nil, fmt.Errorf("hand-over: the source at %s: %w", path, err)
	}
	return c, nil
}

// Listen creates the source's listening socket at path (--migrate-to);
// a stale socket file is replaced.
func Listen(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	l, err := net.ListenUnix(Network, &net.UnixAddr{Name: path, Net: Network})
	if err != nil {
		return nil, fmt.Errorf("hand-over: listen at %s: %w", path, err)
	}
	return l, nil
}

// Accept takes the next destination from l and exchanges HELLOs.
func Accept(l *net.UnixListener) (*Conn, error) {
	uc, err := l.AcceptUnix()
	if err != nil {
		return nil, err
	}
	c := newConn(uc)
	if err := c.expect(msgHello); err != nil {
		c.Close()
		return nil, fmt.Errorf("hand-over: destination: %w", err)
	}
	if err := c.send(appendHeader(nil, msgHello, 0, 0), nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// expect reads one message, which must be of type t and carry nothing.
func (c *Conn) expect(t msgType) error {
	c.uc.SetReadDeadline(time.Now().Add(StepTimeout))
	defer c.uc.SetReadDeadline(time.Time{})
	m, fds, err := c.read()
	closeAll(fds)
	if err != nil {
		return err
	}
	if m.typ != t {
		return fmt.Errorf("%v, want %v: %w", m.typ, t, ErrMalformed)
	}
	return nil
}

// SendState sends items: STATE messages, then END. The items' sockets are
// duplicated into the peer; the caller keeps its own.
func (c *Conn) SendState(items []Item) error {
	total := len(items)
	if total > MaxItems {
		return fmt.Errorf("hand-over: %d flows, at most %d: %w", len(items), MaxItems, ErrMalformed)
	}
	var b []byte
	for len(items) > 0 {
		n, nfd := 0, 0
		fds := make([]int, 0, MaxFDsPerMessage)
		for n < len(items) && n < MaxItemsPerMessage && (items[n].FD < 0 || nfd < MaxFDsPerMessage) {
			if fd := items[n].FD; fd >= 0 {
				fds = append(fds, fd)
				nfd++
			}
			n++
		}
		var err error
		if b, err = encodeState(b[:0], items[:n]); err != nil {
			return fmt.Errorf("hand-over: %w", err)
		}
		if err := c.send(b, fds); err != nil {
			return err
		}
		items = items[n:]
	}
	return c.send(appendHeader(nil, msgEnd, uint32(total), 0), nil)
}

// SendAbort tells the destination that the state it has is stale.
func (c *Conn) SendAbort() error { return c.send(appendHeader(nil, msgAbort, 0, 0), nil) }

// SendCommit tells the source that the destination took the flows.
func (c *Conn) SendCommit() error { return c.send(appendHeader(nil, msgCommit, 0, 0), nil) }

func (c *Conn) send(b []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.uc.SetWriteDeadline(time.Now().Add(StepTimeout))
	defer c.uc.SetWriteDeadline(time.Time{})
	if _, _, err := c.uc.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("hand-over: send: %w", err)
	}
	return nil
}

// read reads one message whole with its descriptors, which the caller owns
// (also on error: they are returned so that nothing leaks, or closed).
func (c *Conn) read() (message, []int, error) {
	n, oobn, flags, _, err := c.uc.ReadMsgUnix(c.buf, c.oob)
	var fds []int
	if oobn > 0 {
		fds = parseRights(c.oob[:oobn])
	}
	if errors.Is(err, io.EOF) && oobn == 0 {
		return message{}, nil, errEOF
	}
	if err != nil {
		closeAll(fds)
		return message{}, nil, fmt.Errorf("hand-over: read: %w", err)
	}
	if n == 0 && oobn == 0 {
		return message{}, nil, errEOF
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll(fds)
		return message{}, nil, fmt.Errorf("message or its descriptors truncated: %w", ErrMalformed)
	}
	m, err := decode(c.buf[:n])
	if err == nil && len(fds) != m.withFD {
		err = fmt.Errorf("%v: %d sockets for %d items with one: %w", m.typ, len(fds), m.withFD, ErrMalformed)
	}
	if err != nil {
		closeAll(fds)
		return m, nil, err
	}
	return m, fds, nil
}

// errEOF is the peer closing the channel between messages.
var errEOF = errors.New("hand-over: channel closed by the peer")

// IsClosed reports whether err is the peer closing the channel.
func IsClosed(err error) bool { return errors.Is(err, errEOF) }

// Event is what Receive read.
type Event struct {
	Abort  bool   // the source's ABORT: the last state is stale
	Commit bool   // the destination's COMMIT
	Items  []Item // a whole state (STATE… END): the caller owns every FD
}

// Receive waits for the next event: a whole state, an ABORT or a COMMIT.
// It waits as long as it takes for the first message; the rest of a state
// must follow within StepTimeout each. On error no descriptor is left open.
func (c *Conn) Receive() (Event, error) {
	var ev Event
	var fail = func(err error) (Event, error) {
		for _, it := range ev.Items {
			if it.FD >= 0 {
				unix.Close(it.FD)
			}
		}
		return Event{}, err
	}
	for first := true; ; first = false {
		if !first {
			c.uc.SetReadDeadline(time.Now().Add(StepTimeout))
		}
		m, fds, err := c.read()
		c.uc.SetReadDeadline(time.Time{})
		if err != nil {
			return fail(err)
		}
		switch {
		case m.typ == msgAbort && first:
			return Event{Abort: true}, nil
		case m.typ == msgCommit && first:
			return Event{Commit: true}, nil
		case m.typ == msgEnd:
			if int(m.count) != len(ev.Items) {
				return fail(fmt.Errorf("END says %d items, %d came: %w", m.count, len(ev.Items), ErrMalformed))
			}
			return ev, nil
		case m.typ != msgState:
			return fail(fmt.Errorf("%v inside a state: %w", m.typ, ErrMalformed))
		}
		if len(ev.Items)+len(m.items) > MaxItems {
			closeAll(fds)
			return fail(fmt.Errorf("more than %d items: %w", MaxItems, ErrMalformed))
		}
		for _, it := range m.items {
			it.Data = append([]byte(nil), it.Data...)
			if it.FD >= 0 {
				it.FD = fds[it.FD]
			}
			ev.Items = append(ev.Items, it)
		}
	}
}

// parseRights returns the descriptors of every SCM_RIGHTS message in oob.
func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
