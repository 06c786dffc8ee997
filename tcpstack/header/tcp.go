package header

import (
	"encoding/binary"
	"net/netip"
)

// TCP header sizes.
const (
	TCPMinimumSize = 20
	TCPMaximumSize = 60
	// TCPMaxOptionsSize is the room for options in a maximum-size header.
	TCPMaxOptionsSize = TCPMaximumSize - TCPMinimumSize
)

// TCPFlags is the flags byte of a TCP header.
type TCPFlags uint8

// TCP flag bits.
const (
	TCPFlagFIN TCPFlags = 1 << iota
	TCPFlagSYN
	TCPFlagRST
	TCPFlagPSH
	TCPFlagACK
	TCPFlagURG
	TCPFlagECE
	TCPFlagCWR
)

// Has reports whether every bit of want is set in f.
func (f TCPFlags) Has(want TCPFlags) bool { return f&want == want }

// TCP option kinds (RFC 9293, 7323, 2018).
const (
	TCPOptionEOL           = 0
	TCPOptionNOP           = 1
	TCPOptionMSS           = 2
	TCPOptionWindowScale   = 3
	TCPOptionSACKPermitted = 4
	TCPOptionSACK          = 5
	TCPOptionTimestamps    = 8
)

// Encoded option lengths.
const (
	TCPOptionMSSLength           = 4
	TCPOptionWindowScaleLength   = 3
	TCPOptionSACKPermittedLength = 2
	TCPOptionTimestampsLength    = 10
	// TCPMaxWindowScale is the largest shift RFC 7323 allows; larger values
	// received are clamped to it.
	TCPMaxWindowScale = 14
	// TCPMaxSACKBlocks is how many SACK blocks fit in 40 option bytes.
	TCPMaxSACKBlocks = 4
)

// TCP is a view of a TCP segment, header first.
type TCP []byte

// ParseTCP validates the TCP header at the start of b (the IP payload): at
// least 20 bytes, and a Data Offset of at least 5 words that fits in b.
func ParseTCP(b []byte) (TCP, error) {
	if len(b) < TCPMinimumSize {
		return nil, ErrTruncated
	}
	off := int(b[12]>>4) * 4
	if off < TCPMinimumSize {
		return nil, ErrBadLength
	}
	if off > len(b) {
		return nil, ErrTruncated
	}
	return TCP(b), nil
}

// SourcePort returns the source port.
func (t TCP) SourcePort() uint16 { return binary.BigEndian.Uint16(t[0:2]) }

// DestinationPort returns the destination port.
func (t TCP) DestinationPort() uint16 { return binary.BigEndian.Uint16(t[2:4]) }

// SequenceNumber returns the sequence number.
func (t TCP) SequenceNumber() uint32 { return binary.BigEndian.Uint32(t[4:8]) }

// AckNumber returns the acknowledgment number.
func (t TCP) AckNumber() uint32 { return binary.BigEndian.Uint32(t[8:12]) }

// DataOffset returns the header length in bytes.
func (t TCP) DataOffset() int { return int(t[12]>>4) * 4 }

// Flags returns the flags byte.
func (t TCP) Flags() TCPFlags { return TCPFlags(t[13]) }

// WindowSize returns the unscaled window field.
func (t TCP) WindowSize() uint16 { return binary.BigEndian.Uint16(t[14:16]) }

// Checksum returns the checksum field.
func (t TCP) Checksum() uint16 { return binary.BigEndian.Uint16(t[16:18]) }

// UrgentPointer returns the urgent pointer.
func (t TCP) UrgentPointer() uint16 { return binary.BigEndian.Uint16(t[18:20]) }

// Options returns the option bytes.
func (t TCP) Options() []byte { return t[TCPMinimumSize:t.DataOffset()] }

// Payload returns the segment data.
func (t TCP) Payload() []byte { return t[t.DataOffset():] }

// IsChecksumValid verifies the checksum with the pseudo-header of src and dst.
func (t TCP) IsChecksumValid(src, dst netip.Addr) bool {
	return Checksum(t, PseudoHeaderChecksum(IPProtocolTCP, src, dst, uint32(len(t)))) == 0xffff
}

// SetChecksum computes the checksum over header and payload with the
// pseudo-header of src and dst.
func (t TCP) SetChecksum(src, dst netip.Addr) {
	t[16], t[17] = 0, 0
	binary.BigEndian.PutUint16(t[16:18], ^Checksum(t, PseudoHeaderChecksum(IPProtocolTCP, src, dst, uint32(len(t)))))
}

// SetWindowSize rewrites the window and patches the checksum incrementally.
func (t TCP) SetWindowSize(w uint16) {
	old := t.WindowSize()
	binary.BigEndian.PutUint16(t[14:16], w)
	binary.BigEndian.PutUint16(t[16:18], ChecksumUpdate(t.Checksum(), old, w))
}

// TCPFields holds the values EncodeTCP writes.
type TCPFields struct {
	SrcPort, DstPort uint16
	SeqNum, AckNum   uint32
	Flags            TCPFlags
	WindowSize       uint16
	UrgentPointer    uint16
	// Options are copied after the fixed header and padded with EOL to a
	// multiple of four; at most TCPMaxOptionsSize bytes.
	Options []byte
}

// EncodeTCP writes a TCP header (zero checksum) into b and returns its
// length, or 0 when b is too short or the options too long.
func EncodeTCP(b []byte, f *TCPFields) int {
	if len(f.Options) > TCPMaxOptionsSize {
		return 0
	}
	hl := TCPMinimumSize + (len(f.Options)+3)&^3
	if len(b) < hl {
		return 0
	}
	binary.BigEndian.PutUint16(b[0:2], f.SrcPort)
	binary.BigEndian.PutUint16(b[2:4], f.DstPort)
	binary.BigEndian.PutUint32(b[4:8], f.SeqNum)
	binary.BigEndian.PutUint32(b[8:12], f.AckNum)
	b[12] = uint8(hl/4) << 4
	b[13] = uint8(f.Flags)
	binary.BigEndian.PutUint16(b[14:16], f.WindowSize)
	b[16], b[17] = 0, 0
	binary.BigEndian.PutUint16(b[18:20], f.UrgentPointer)
	n := copy(b[TCPMinimumSize:], f.Options)
	clear(b[TCPMinimumSize+n : hl])
	return hl
}

// TCPSACKBlock is one selective acknowledgment range [Start, End).
type TCPSACKBlock struct{ Start, End uint32 }

// TCPOptions is the parsed form of the options a translator cares about.
type TCPOptions struct {
	HasMSS         bool
	MSS            uint16
	HasWindowScale bool
	// WindowScale is the shift, clamped to TCPMaxWindowScale.
	WindowScale   uint8
	SACKPermitted bool
	HasTimestamps bool
	TSVal, TSEcr  uint32
	// SACKBlocks[:NumSACKBlocks] are the SACK option's blocks.
	SACKBlocks    [TCPMaxSACKBlocks]TCPSACKBlock
	NumSACKBlocks int
}

// ParseTCPOptions decodes opts (TCP.Options) into o. Unknown options are
// skipped by their length. A wrong length for a known option, a length
// below 2 or running past the list returns ErrBadOption; fields decoded
// before the error are left in o.
func ParseTCPOptions(opts []byte, o *TCPOptions) error {
	*o = TCPOptions{}
	for len(opts) > 0 {
		kind := opts[0]
		switch kind {
		case TCPOptionEOL:
			return nil
		case TCPOptionNOP:
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 {
			return ErrBadOption
		}
		l := int(opts[1])
		if l < 2 || l > len(opts) {
			return ErrBadOption
		}
		data := opts[2:l]
		switch kind {
		case TCPOptionMSS:
			if l != TCPOptionMSSLength {
				return ErrBadOption
			}
			o.HasMSS, o.MSS = true, binary.BigEndian.Uint16(data)
		case TCPOptionWindowScale:
			if l != TCPOptionWindowScaleLength {
				return ErrBadOption
			}
			o.HasWindowScale, o.WindowScale = true, min(data[0], TCPMaxWindowScale)
		case TCPOptionSACKPermitted:
			if l != TCPOptionSACKPermittedLength {
				return ErrBadOption
			}
			o.SACKPermitted = true
		case TCPOptionTimestamps:
			if l != TCPOptionTimestampsLength {
				return ErrBadOption
			}
			o.HasTimestamps = true
			o.TSVal = binary.BigEndian.Uint32(data[0:4])
			o.TSEcr = binary.BigEndian.Uint32(data[4:8])
		case TCPOptionSACK:
			if len(data)%8 != 0 || len(data) == 0 {
				return ErrBadOption
			}
			o.NumSACKBlocks = 0
			for i := 0; i+8 <= len(data) && o.NumSACKBlocks < TCPMaxSACKBlocks; i += 8 {
				o.SACKBlocks[o.NumSACKBlocks] = TCPSACKBlock{
					Start: binary.BigEndian.Uint32(data[i : i+4]),
					End:   binary.BigEndian.Uint32(data[i+4 : i+8]),
				}
				o.NumSACKBlocks++
			}
		}
		opts = opts[l:]
	}
	return nil
}

// EncodeTCPOptions writes the options set in o into b in the order Linux
// uses on a SYN (MSS; SACK-permitted folded into the timestamps' padding;
// NOP + window scale) followed by any SACK blocks, padded with NOPs to a
// multiple of four. It returns the length written, or 0 when b (or the
// 40-byte option space) is too small.
func EncodeTCPOptions(b []byte, o *TCPOptions) int {
	need := 0
	if o.HasMSS {
		need += 4
	}
	if o.HasTimestamps || o.SACKPermitted {
		// "SACKOK TS" or "NOP NOP TS" or "NOP NOP SACKOK".
		if o.HasTimestamps {
			need += 12
		} else {
			need += 4
		}
	}
	if o.HasWindowScale {
		need += 4
	}
	if o.NumSACKBlocks > 0 {
		need += 4 + 8*min(o.NumSACKBlocks, TCPMaxSACKBlocks)
	}
	if need > TCPMaxOptionsSize || need > len(b) {
		return 0
	}
	n := 0
	if o.HasMSS {
		b[0], b[1] = TCPOptionMSS, TCPOptionMSSLength
		binary.BigEndian.PutUint16(b[2:4], o.MSS)
		n = 4
	}
	switch {
	case o.HasTimestamps:
		if o.SACKPermitted {
			b[n], b[n+1] = TCPOptionSACKPermitted, TCPOptionSACKPermittedLength
		} else {
			b[n], b[n+1] = TCPOptionNOP, TCPOptionNOP
		}
		b[n+2], b[n+3] = TCPOptionTimestamps, TCPOptionTimestampsLength
		binary.BigEndian.PutUint32(b[n+4:n+8], o.TSVal)
		binary.BigEndian.PutUint32(b[n+8:n+12], o.TSEcr)
		n += 12
	case o.SACKPermitted:
		b[n], b[n+1], b[n+2], b[n+3] = TCPOptionNOP, TCPOptionNOP, TCPOptionSACKPermitted, TCPOptionSACKPermittedLength
		n += 4
	}
	if o.HasWindowScale {
		b[n], b[n+1], b[n+2], b[n+3] = TCPOptionNOP, TCPOptionWindowScale, TCPOptionWindowScaleLength, min(o.WindowScale, TCPMaxWindowScale)
		n += 4
	}
	if k := min(o.NumSACKBlocks, TCPMaxSACKBlocks); k > 0 {
		b[n], b[n+1], b[n+2], b[n+3] = TCPOptionNOP, TCPOptionNOP, TCPOptionSACK, uint8(2+8*k)
		n += 4
		for _, s := range o.SACKBlocks[:k] {
			binary.BigEndian.PutUint32(b[n:n+4], s.Start)
			binary.BigEndian.PutUint32(b[n+4:n+8], s.End)
			n += 8
		}
	}
	return n
}
