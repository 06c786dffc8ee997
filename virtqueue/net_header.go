package virtqueue

import (
	"encoding/binary"
	"errors"
)

// Sizes of struct virtio_net_hdr.
const (
	// NetHdrLen is the header with num_buffers: used when VIRTIO_F_VERSION_1
	// or VIRTIO_NET_F_MRG_RXBUF is negotiated.
	NetHdrLen = 12
	// NetHdrLenLegacy is the header of a legacy device without MRG_RXBUF.
	NetHdrLenLegacy = 10
)

// virtio-net header flags and GSO types.
const (
	NetHdrFNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM: checksum at CsumStart+CsumOffset is partial
	NetHdrFDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID: checksum already verified
	NetHdrFRSCInfo   = 4 // VIRTIO_NET_HDR_F_RSC_INFO

	GSONone   = 0    // VIRTIO_NET_HDR_GSO_NONE
	GSOTCPv4  = 1    // VIRTIO_NET_HDR_GSO_TCPV4
	GSOUDP    = 3    // VIRTIO_NET_HDR_GSO_UDP (UFO)
	GSOTCPv6  = 4    // VIRTIO_NET_HDR_GSO_TCPV6
	GSOUDPL4  = 5    // VIRTIO_NET_HDR_GSO_UDP_L4 (USO)
	GSOECN    = 0x80 // VIRTIO_NET_HDR_GSO_ECN, or'ed into the GSO type
	gsoTypeMk = 0x7f
)

// ErrShortNetHdr is returned by NetHdr.Decode for fewer than NetHdrLenLegacy bytes.
var ErrShortNetHdr = errors.New("virtio-net header: short buffer")

// NetHdrLenFor returns the virtio-net header length the negotiated features
// imply: 12 with VERSION_1 or MRG_RXBUF, else 10.
func NetHdrLenFor(features uint64) int {
	if HasFeature(features, FeatureVersion1) || HasFeature(features, FeatureNetMrgRxbuf) {
		return NetHdrLen
	}
	return NetHdrLenLegacy
}

// NetHdr is struct virtio_net_hdr (with num_buffers), fields in host order.
// The wire form is little-endian: VERSION_1 mandates it and legacy guests
// are little-endian x86/arm64 here.
type NetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16 // only on the wire in the 12-byte form
}

// Decode parses the header from b, which must be exactly the header as the
// negotiated features size it (b[:NetHdrLenFor(features)]): with 12 bytes or
// more NumBuffers is read from b[10:12], with 10 or 11 it is set to 0. It
// never looks beyond b and does not judge the values; that is the caller's
// policy. Fewer than 10 bytes give ErrShortNetHdr.
func (h *NetHdr) Decode(b []byte) error {
	if len(b) < NetHdrLenLegacy {
		return ErrShortNetHdr
	}
	h.Flags = b[0]
	h.GSOType = b[1]
	h.HdrLen = binary.LittleEndian.Uint16(b[2:])
	h.GSOSize = binary.LittleEndian.Uint16(b[4:])
	h.CsumStart = binary.LittleEndian.Uint16(b[6:])
	h.CsumOffset = binary.LittleEndian.Uint16(b[8:])
	h.NumBuffers = 0
	if len(b) >= NetHdrLen {
		h.NumBuffers = binary.LittleEndian.Uint16(b[10:])
	}
	return nil
}

// Encode writes the header into b and returns the bytes written: 12 when
// len(b) >= 12, 10 when len(b) is 10 or 11, 0 (nothing written) when b is
// shorter. Pass b[:NetHdrLenFor(features)] so that a legacy 10-byte header
// never overwrites the first two bytes of the frame behind it.
func (h *NetHdr) Encode(b []byte) int {
	if len(b) < NetHdrLenLegacy {
		return 0
	}
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	if len(b) < NetHdrLen {
		return NetHdrLenLegacy
	}
	binary.LittleEndian.PutUint16(b[10:], h.NumBuffers)
	return NetHdrLen
}

// GSOKind returns the GSO type without the ECN bit.
func (h *NetHdr) GSOKind() uint8 { return h.GSOType & gsoTypeMk }

// NeedsCsum reports whether the frame carries a partial checksum the
// receiver has to complete (CsumStart/CsumOffset are meaningful).
func (h *NetHdr) NeedsCsum() bool { return h.Flags&NetHdrFNeedsCsum != 0 }
