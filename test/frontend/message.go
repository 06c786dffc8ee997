package frontend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// MaxReplyPayload bounds what Recv accepts from the back-end: no reply of
// the protocol is larger than a memory table.
const MaxReplyPayload = 4096

// Msg is one received vhost-user message.
type Msg struct {
	Request Request
	Flags   uint32
	Payload []byte
}

// U64 decodes a u64 payload.
func (m Msg) U64() (uint64, error) {
	if len(m.Payload) < 8 {
		return 0, fmt.Errorf("reply to %d: payload %d bytes, want 8", m.Request, len(m.Payload))
	}
	return binary.LittleEndian.Uint64(m.Payload), nil
}

// NackError is a REPLY_ACK reply carrying a non-zero status.
type NackError struct {
	Request Request
	Status  uint64
}

func (e *NackError) Error() string {
	return fmt.Sprintf("back-end rejected request %d (status %d)", e.Request, e.Status)
}

// ErrClosed means the back-end closed the connection.
var ErrClosed = errors.New("vhost-user connection closed by back-end")

// Conn is the front-end end of a vhost-user socket. It is not safe for
// concurrent use: like QEMU, one request is in flight at a time.
type Conn struct {
	c *net.UnixConn
	// Timeout bounds each Recv; zero means 5 seconds.
	Timeout time.Duration
}

// NewConn wraps an already-connected socket.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c} }

// DialConn connects to a back-end listening on path.
func DialConn(path string) (*Conn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	return NewConn(c), nil
}

// UnixConn returns the underlying socket.
func (c *Conn) UnixConn() *net.UnixConn { return c.c }

// Close closes the socket.
func (c *Conn) Close() error { return c.c.Close() }

// EncodeHeader builds a 12-byte message header.
func EncodeHeader(req Request, flags, size uint32) []byte {
	h := make([]byte, HeaderLen)
	binary.LittleEndian.PutUint32(h[0:], uint32(req))
	binary.LittleEndian.PutUint32(h[4:], flags)
	binary.LittleEndian.PutUint32(h[8:], size)
	return h
}

// Send writes one well-formed request (version 1 plus extra flags) with fds
// attached as SCM_RIGHTS.
func (c *Conn) Send(req Request, flags uint32, payload []byte, fds []int) error {
	hdr := EncodeHeader(req, FlagVersion|flags, uint32(len(payload)))
	if err := c.SendRaw(hdr, payload, fds); err != nil {
		return fmt.Errorf("send request %d: %w", req, err)
	}
	return nil
}

// SendRaw writes hdr followed by payload in one sendmsg with fds attached,
// without any check: hostile tests use it for lying sizes, truncated headers
// and wrong fd counts.
func (c *Conn) SendRaw(hdr, payload []byte, fds []int) error {
	b := make([]byte, 0, len(hdr)+len(payload))
	b = append(append(b, hdr...), payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := c.c.SetWriteDeadline(time.Now().Add(c.timeout())); err != nil {
		return fmt.Errorf("set write deadline: %w", err)
	}
	n, _, err := c.c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("sendmsg: %w", err)
	}
	if n != len(b) {
		return fmt.Errorf("sendmsg: short write %d of %d", n, len(b))
	}
	return nil
}

func (c *Conn) timeout() time.Duration {
	if c.Timeout <= 0 {
		return 5 * time.Second
	}
	return c.Timeout
}

// Recv reads one message from the back-end. Fds the back-end might attach are
// closed: no reply of the supported requests carries any.
func (c *Conn) Recv() (Msg, error) {
	if err := c.c.SetReadDeadline(time.Now().Add(c.timeout())); err != nil {
		return Msg{}, fmt.Errorf("set read deadline: %w", err)
	}
	hdr := make([]byte, HeaderLen)
	if err := c.readFull(hdr); err != nil {
		return Msg{}, fmt.Errorf("read reply header: %w", err)
	}
	m := Msg{
		Request: Request(binary.LittleEndian.Uint32(hdr[0:])),
		Flags:   binary.LittleEndian.Uint32(hdr[4:]),
	}
	size := binary.LittleEndian.Uint32(hdr[8:])
	if size > MaxReplyPayload {
		return m, fmt.Errorf("reply to %d: payload size %d too large", m.Request, size)
	}
	m.Payload = make([]byte, size)
	if err := c.readFull(m.Payload); err != nil {
		return m, fmt.Errorf("read reply payload: %w", err)
	}
	return m, nil
}

func (c *Conn) readFull(b []byte) error {
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	for off := 0; off < len(b); {
		n, oobn, _, _, err := c.c.ReadMsgUnix(b[off:], oob)
		closeRights(oob[:oobn])
		if n == 0 && err == nil {
			return ErrClosed
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return ErrClosed
			}
			return err
		}
		off += n
	}
	return nil
}

func closeRights(oob []byte) {
	if len(oob) == 0 {
		return
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// Call sends a request that has a reply and returns the reply, checking that
// it answers this request and carries the reply flag.
func (c *Conn) Call(req Request, payload []byte, fds []int) (Msg, error) {
	if err := c.Send(req, 0, payload, fds); err != nil {
		return Msg{}, err
	}
	return c.expectReply(req)
}

func (c *Conn) expectReply(req Request) (Msg, error) {
	m, err := c.Recv()
	if err != nil {
		return m, fmt.Errorf("request %d: %w", req, err)
	}
	if m.Request != req {
		return m, fmt.Errorf("request %d: reply is for request %d", req, m.Request)
	}
	if m.Flags&FlagReply == 0 || m.Flags&3 != FlagVersion {
		return m, fmt.Errorf("request %d: reply flags %#x", req, m.Flags)
	}
	return m, nil
}

// Do sends a request without a reply of its own. With needReply (only
// meaningful once REPLY_ACK is negotiated) it sets NEED_REPLY and waits for
// the status; a non-zero status is returned as *NackError.
func (c *Conn) Do(req Request, payload []byte, fds []int, needReply bool) error {
	var flags uint32
	if needReply {
		flags = FlagNeedReply
	}
	if err := c.Send(req, flags, payload, fds); err != nil {
		return err
	}
	if !needReply {
		return nil
	}
	m, err := c.expectReply(req)
	if err != nil {
		return err
	}
	st, err := m.U64()
	if err != nil {
		return err
	}
	if st != 0 {
		return &NackError{Request: req, Status: st}
	}
	return nil
}

// PayloadU64 encodes a u64 payload.
func PayloadU64(v uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

// PayloadVringState encodes a vring state (index, num).
func PayloadVringState(index, num uint32) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b[0:], index)
	binary.LittleEndian.PutUint32(b[4:], num)
	return b
}

// VringAddr is the SET_VRING_ADDR payload; ring addresses are front-end
// virtual addresses.
type VringAddr struct {
	Index, Flags           uint32
	Desc, Used, Avail, Log uint64
}

// Encode returns the 40-byte payload.
func (a VringAddr) Encode() []byte {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint32(b[0:], a.Index)
	binary.LittleEndian.PutUint32(b[4:], a.Flags)
	binary.LittleEndian.PutUint64(b[8:], a.Desc)
	binary.LittleEndian.PutUint64(b[16:], a.Used)
	binary.LittleEndian.PutUint64(b[24:], a.Avail)
	binary.LittleEndian.PutUint64(b[32:], a.Log)
	return b
}

// Region describes one memory region as sent in SET_MEM_TABLE / ADD_MEM_REG.
type Region struct {
	GuestAddr  uint64
	Size       uint64
	UserAddr   uint64
	MmapOffset uint64
}

func (r Region) put(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], r.GuestAddr)
	binary.LittleEndian.PutUint64(b[8:], r.Size)
	binary.LittleEndian.PutUint64(b[16:], r.UserAddr)
	binary.LittleEndian.PutUint64(b[24:], r.MmapOffset)
}

// PayloadMemTable encodes a SET_MEM_TABLE payload: count, padding, then the
// regions; like QEMU, the size covers only the regions present.
func PayloadMemTable(regions []Region) []byte {
	b := make([]byte, 8+32*len(regions))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(regions)))
	for i, r := range regions {
		r.put(b[8+32*i:])
	}
	return b
}

// PayloadMemReg encodes an ADD_MEM_REG / REM_MEM_REG payload: 8 bytes of
// padding then one region.
func PayloadMemReg(r Region) []byte {
	b := make([]byte, 40)
	r.put(b[8:])
	return b
}
