package vhostuser

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Message is one request read from the front-end.
type Message struct {
	Header  Header
	Payload []byte // aliases the Conn's buffer: valid until the next ReadMessage
	FDs     []int  // received descriptors; the reader owns them (keep or close)
}

// closeFDs closes every descriptor still held by m and forgets them.
func (m *Message) closeFDs() {
	for _, fd := range m.FDs {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	m.FDs = m.FDs[:0]
}

// takeFD hands descriptor i over to the caller; closeFDs will not close it.
func (m *Message) takeFD(i int) int {
	fd := m.FDs[i]
	m.FDs[i] = -1
	return fd
}

// errIdle wraps a read error that came before any byte of a message.
var errIdle = errors.New("waiting for a message")

// Conn frames vhost-user messages on a connected UNIX stream socket:
// requests with SCM_RIGHTS descriptors in, replies out. It is used by one
// goroutine at a time.
type Conn struct {
	uc  *net.UnixConn
	raw syscall.RawConn
	buf [HeaderSize + MaxPayloadSize]byte
	oob []byte
	fds []int
	out []byte

	// idleDeadline bounds the wait for a message's first byte (zero:
	// none); msgTimeout bounds the rest of a message once it began (zero:
	// none). See SetTimeouts.
	idleDeadline time.Time
	msgTimeout   time.Duration
	deadline     time.Time // the read deadline last set
	interrupted  atomic.Bool
}

// NewConn wraps a connected socket. Closing the Conn closes uc.
func NewConn(uc *net.UnixConn) (*Conn, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("vhost-user conn: %w", err)
	}
	return &Conn{
		uc:  uc,
		raw: raw,
		// Room for exactly MaxFDs descriptors: more sets MSG_CTRUNC, which
		// is how an over-long fd list is detected (the kernel closes the
		// ones that did not fit).
		oob: make([]byte, unix.CmsgSpace(MaxFDs*4)),
		fds: make([]int, 0, MaxFDs),
		out: make([]byte, 0, HeaderSize+64),
	}, nil
}

// fd returns the socket's descriptor, valid until Close, or -1.
func (c *Conn) fd() int {
	fd := -1
	c.raw.Control(func(s uintptr) { fd = int(s) })
	return fd
}

// Close closes the socket.
func (c *Conn) Close() error { return c.uc.Close() }

// SetTimeouts bounds the reads of the following messages: idle is the
// deadline for the first byte of the next message (zero time: wait
// forever, as between the messages of a running session), message the time
// the rest of a message may take once its first byte arrived (zero: no
// limit). A read past either fails with an error that wraps
// os.ErrDeadlineExceeded.
func (c *Conn) SetTimeouts(idle time.Time, message time.Duration) {
	c.idleDeadline, c.msgTimeout = idle, message
}

// Interrupt makes a blocked or later ReadMessage or WriteReply fail at
// once. It may be called from any goroutine; it does not close the socket
// (which would race the descriptor with a reader).
func (c *Conn) Interrupt() {
	c.interrupted.Store(true)
	c.uc.SetReadDeadline(time.Unix(1, 0))
	c.uc.SetWriteDeadline(time.Unix(1, 0))
}

// setDeadline sets the socket's read deadline unless it is already t, and
// never undoes an Interrupt.
func (c *Conn) setDeadline(t time.Time) {
	if t.Equal(c.deadline) {
		return
	}
	c.deadline = t
	c.uc.SetReadDeadline(t)
	if c.interrupted.Load() {
		c.deadline = time.Unix(1, 0)
		c.uc.SetReadDeadline(c.deadline)
	}
}

// ReadMessage reads one complete request into m. It returns io.EOF when the
// front-end closed the socket between messages. Any other error means the
// stream can no longer be framed and the connection must be closed; no
// descriptors are leaked on error. The payload is not checked against the
// request type here (see ValidateMessage), so a well-framed but invalid
// message can still be answered.
func (c *Conn) ReadMessage(m *Message) error {
	c.fds = c.fds[:0]
	m.FDs = nil
	c.setDeadline(c.idleDeadline)
	n, err := c.readFull(c.buf[:HeaderSize])
	if err != nil {
		c.closeReceived()
		if n == 0 && errors.Is(err, io.EOF) {
			return io.EOF
		}
		if n == 0 {
			return fmt.Errorf("%w: %w", errIdle, err)
		}
		return fmt.Errorf("read header: %w", err)
	}
	h, err := DecodeHeader(c.buf[:HeaderSize])
	if err != nil {
		c.closeReceived()
		return err
	}
	payload := c.buf[HeaderSize : HeaderSize+int(h.Size)]
	if _, err := c.readFull(payload); err != nil {
		c.closeReceived()
		return fmt.Errorf("read %v payload (%d bytes): %w", h.Request, h.Size, err)
	}
	m.Header = h
	m.Payload = payload
	m.FDs = c.fds
	return nil
}

// closeReceived closes descriptors collected for a message that is dropped.
func (c *Conn) closeReceived() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
	c.fds = c.fds[:0]
}

// readFull reads exactly len(p) bytes, collecting SCM_RIGHTS descriptors
// from every segment. It returns the number of bytes read. The first bytes
// of a message start its message timeout.
func (c *Conn) readFull(p []byte) (int, error) {
	got := 0
	for got < len(p) {
		n, err := c.recv(p[got:])
		if got == 0 && n > 0 && c.msgTimeout > 0 && c.deadline.Equal(c.idleDeadline) {
			c.setDeadline(time.Now().Add(c.msgTimeout))
		}
		got += n
		if err != nil {
			return got, err
		}
		if n == 0 {
			if got == 0 {
				return 0, io.EOF
			}
			return got, fmt.Errorf("after %d of %d bytes: %w", got, len(p), io.ErrUnexpectedEOF)
		}
	}
	return got, nil
}

// recv does one recvmsg through the runtime poller (so deadlines and Close
// interrupt it) and appends any received descriptors to c.fds.
func (c *Conn) recv(p []byte) (int, error) {
	var n, oobn, flags int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), p, c.oob, unix.MSG_CMSG_CLOEXEC)
			if rerr != unix.EINTR {
				break
			}
		}
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if oobn > 0 {
		if perr := c.collectFDs(c.oob[:oobn]); perr != nil {
			return n, perr
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return n, fmt.Errorf("more than %d fds: %w", MaxFDs, ErrFDCount)
	}
	return n, nil
}

// collectFDs takes ownership of every descriptor in the control data, even
// when it then reports an error, so the caller can close them all.
func (c *Conn) collectFDs(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("control message: %w", ErrMalformed)
	}
	var tooMany bool
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if len(c.fds) >= MaxFDs {
				unix.Close(fd)
				tooMany = true
				continue
			}
			c.fds = append(c.fds, fd)
		}
	}
	if tooMany {
		return fmt.Errorf("more than %d fds: %w", MaxFDs, ErrFDCount)
	}
	return nil
}

// WriteReply sends a reply to req with the given payload (version 1, REPLY).
// A front-end that stops reading its replies cannot hold the session (and
// the daemon's shutdown) in a blocked write: the write fails with an error
// that wraps os.ErrDeadlineExceeded once the message timeout passed, and
// at once after Interrupt.
func (c *Conn) WriteReply(req Request, payload []byte) error {
	c.out = c.out[:HeaderSize]
	Header{Request: req, Flags: FlagVersion1 | FlagReply, Size: uint32(len(payload))}.Encode(c.out)
	c.out = append(c.out, payload...)
	if c.msgTimeout > 0 {
		c.uc.SetWriteDeadline(time.Now().Add(c.msgTimeout))
		if c.interrupted.Load() { // an Interrupt between the two: keep it
			c.uc.SetWriteDeadline(time.Unix(1, 0))
		}
	}
	if _, err := c.uc.Write(c.out); err != nil {
		return fmt.Errorf("write %v reply: %w", req, err)
	}
	return nil
}

// DecodeMessage splits one message off the front of b, as ReadMessage does
// off the socket but without descriptors. It returns the remaining bytes.
func DecodeMessage(b []byte) (h Header, payload, rest []byte, err error) {
	h, err = DecodeHeader(b)
	if err != nil {
		return h, nil, nil, err
	}
	end := HeaderSize + int(h.Size)
	if len(b) < end {
		return h, nil, nil, fmt.Errorf("%v payload: %d of %d bytes: %w", h.Request, len(b)-HeaderSize, h.Size, ErrTruncated)
	}
	return h, b[HeaderSize:end], b[end:], nil
}
