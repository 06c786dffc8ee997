package frontend

import (
	"encoding/binary"
	"fmt"
)

// NetHdr is the virtio-net header that precedes every frame on both queues.
type NetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16 // present only in the 12-byte form
}

// Net header flag and GSO values.
const (
	NetHdrFNeedsCsum = 1
	NetHdrFDataValid = 2
	GSONone          = 0
	GSOTCPv4         = 1
	GSOUDP           = 3
	GSOTCPv6         = 4
	GSOUDPL4         = 5 // VIRTIO_NET_HDR_GSO_UDP_L4 (USO): datagrams of GSOSize each
	GSOECN           = 0x80
)

// NetHdrLen returns the header size the negotiated features imply: 12 with
// VERSION_1 or MRG_RXBUF, else the legacy 10.
func NetHdrLen(features uint64) int {
	if features&(Bit(FeatVersion1)|Bit(FeatMrgRxbuf)) != 0 {
		return 12
	}
	return 10
}

// Encode writes the header into b (10 or 12 bytes, len(b) must be one).
func (h NetHdr) Encode(b []byte) {
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	if len(b) >= 12 {
		binary.LittleEndian.PutUint16(b[10:], h.NumBuffers)
	}
}

// DecodeNetHdr parses an n-byte header (10 or 12) from b.
func DecodeNetHdr(b []byte, n int) (NetHdr, error) {
	if len(b) < n {
		return NetHdr{}, fmt.Errorf("virtio-net header: %d bytes, want %d", len(b), n)
	}
	h := NetHdr{
		Flags:      b[0],
		GSOType:    b[1],
		HdrLen:     binary.LittleEndian.Uint16(b[2:]),
		GSOSize:    binary.LittleEndian.Uint16(b[4:]),
		CsumStart:  binary.LittleEndian.Uint16(b[6:]),
		CsumOffset: binary.LittleEndian.Uint16(b[8:]),
	}
	if n >= 12 {
		h.NumBuffers = binary.LittleEndian.Uint16(b[10:])
	}
	return h, nil
}
