package stream

import (
	"io"

	"vunet/tcpstack/hostsock"
)

// ReadBufSize is the default size of a Reader's buffer: many frames per
// recv, and always room for a whole frame behind a partial one.
const ReadBufSize = 512 << 10

// Reader takes frames off a stream socket. Read fills its buffer with
// one recv; Next then hands out the complete frames in it, in order. A
// frame split across reads stays in the buffer and is completed by the
// next Read.
type Reader struct {
	buf        []byte
	start, end int  // buf[start:end] is read and not yet handed out
	full       bool // the last Read filled the buffer: the socket may have more
	io         hostsock.IO
	iov        [1][]byte
}

// Init gives r a buffer of size bytes (at least two largest frames).
func (r *Reader) Init(size int) {
	size = max(size, 2*(LenSize+MaxFrame))
	r.buf = make([]byte, size)
	r.start, r.end = 0, 0
}

// Reset forgets what is buffered (a new connection).
func (r *Reader) Reset() { r.start, r.end, r.full = 0, 0, false }

// Read receives what the socket has, without blocking, behind the bytes
// already buffered. It returns the bytes read; io.EOF when the peer
// closed its end; unix.EAGAIN when nothing was there. Frames from Next
// are valid until the next Read (it moves a partial frame to the front
// of the buffer).
func (r *Reader) Read(fd int) (int, error) {
	r.iov[0] = r.room()
	n, _, err := r.io.Recv(fd, r.iov[:], 0)
	r.iov[0] = nil
	if err != nil {
		r.full = false
		return 0, err
	}
	if n == 0 {
		r.full = false
		return 0, io.EOF
	}
	r.added(n)
	return n, nil
}

// room returns the free buffer behind what is held, after moving a
// partial frame to the front when not enough is free for a whole frame
// behind it (the frame is shorter than that, so the move is cheap next
// to the read that follows).
func (r *Reader) room() []byte {
	if r.start == r.end {
		r.start, r.end = 0, 0
	} else if len(r.buf)-r.end < LenSize+MaxFrame {
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	return r.buf[r.end:]
}

// added takes n bytes just read into room().
func (r *Reader) added(n int) {
	r.full = n == len(r.buf)-r.end
	r.end += n
}

// Full reports whether the last Read filled the buffer: the socket may
// hold more. Otherwise it had no more than was read.
func (r *Reader) Full() bool { return r.full }

// Next returns the next complete frame buffered, nil when there is none
// (yet), or ErrFrameLength: then the connection must be closed.
func (r *Reader) Next() ([]byte, error) {
	frame, n, err := Parse(r.buf[r.start:r.end])
	if n == 0 || err != nil {
		return nil, err
	}
	r.start += n
	return frame, nil
}

// Buffered returns how many bytes of an incomplete frame are held.
func (r *Reader) Buffered() int { return r.end - r.start }
