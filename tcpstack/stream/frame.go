package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	// LenSize is the size of the length in front of every frame.
	LenSize = 4
	// MinFrame is the shortest frame accepted from the peer: an Ethernet
	// header (passt closes the connection on anything shorter).
	MinFrame = 14
	// MaxFrame is the longest frame either way: passt's limit for frames
	// from QEMU (ETH_MAX_MTU), and within what QEMU takes (its read state
	// holds 69632 bytes and closes the connection beyond). The guest's
	// MTU, 65520 at most, keeps frames to the guest below it.
	MaxFrame = 65535
)

// ErrFrameLength is a frame length out of [MinFrame, MaxFrame]: the peer
// is not speaking the protocol, or lost its place in the stream; nothing
// after it can be trusted.
var ErrFrameLength = errors.New("stream frame length out of bounds")

// Parse takes the first frame off b: frame is its bytes (pointing into
// b) and n the bytes it occupies with its length prefix. A frame not
// complete in b yet gives n == 0 and no error; a length out of bounds
// gives ErrFrameLength (wrapped with the length).
func Parse(b []byte) (frame []byte, n int, err error) {
	if len(b) < LenSize {
		return nil, 0, nil
	}
	l := binary.BigEndian.Uint32(b)
	if l < MinFrame || l > MaxFrame {
		return nil, 0, fmt.Errorf("%w: %d bytes", ErrFrameLength, l)
	}
	end := LenSize + int(l)
	if len(b) < end {
		return nil, 0, nil
	}
	return b[LenSize:end:end], end, nil
}

// putLen writes the length prefix of a frame of n bytes.
func putLen(b []byte, n int) { binary.BigEndian.PutUint32(b, uint32(n)) }
