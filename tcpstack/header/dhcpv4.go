package header

import (
	"encoding/binary"
	"net/netip"
)

// DHCPv4 sizes and well-known values (RFC 2131, RFC 2132).
const (
	// DHCPv4MinimumSize is the fixed BOOTP part plus the magic cookie.
	DHCPv4MinimumSize = 240
	// DHCPv4MinimumReplySize is the smallest message RFC 1542 lets a server
	// send; some old BOOTP clients drop shorter ones.
	DHCPv4MinimumReplySize = 300
	// DHCPv4ServerPort and DHCPv4ClientPort are the UDP ports.
	DHCPv4ServerPort = 67
	DHCPv4ClientPort = 68
	// DHCPv4BroadcastFlag is the B bit of the flags field.
	DHCPv4BroadcastFlag = 0x8000
	// DHCPv4OpRequest and DHCPv4OpReply are BOOTP op codes.
	DHCPv4OpRequest = 1
	DHCPv4OpReply   = 2
	dhcpv4Magic     = 0x63825363
	dhcpv4OptionsAt = 240
)

// DHCPv4MessageType is the value of option 53.
type DHCPv4MessageType uint8

// DHCPv4 message types.
const (
	DHCPDiscover DHCPv4MessageType = 1
	DHCPOffer    DHCPv4MessageType = 2
	DHCPRequest  DHCPv4MessageType = 3
	DHCPDecline  DHCPv4MessageType = 4
	DHCPAck      DHCPv4MessageType = 5
	DHCPNak      DHCPv4MessageType = 6
	DHCPRelease  DHCPv4MessageType = 7
	DHCPInform   DHCPv4MessageType = 8
)

// DHCPv4 option codes.
const (
	DHCPv4OptPad             = 0
	DHCPv4OptSubnetMask      = 1
	DHCPv4OptRouter          = 3
	DHCPv4OptDNS             = 6
	DHCPv4OptHostName        = 12
	DHCPv4OptDomainName      = 15
	DHCPv4OptInterfaceMTU    = 26
	DHCPv4OptBroadcastAddr   = 28
	DHCPv4OptRequestedIP     = 50
	DHCPv4OptLeaseTime       = 51
	DHCPv4OptOverload        = 52
	DHCPv4OptMessageType     = 53
	DHCPv4OptServerID        = 54
	DHCPv4OptParamRequest    = 55
	DHCPv4OptMessage         = 56
	DHCPv4OptMaxMessageSize  = 57
	DHCPv4OptRenewalTime     = 58
	DHCPv4OptRebindingTime   = 59
	DHCPv4OptClientID        = 61
	DHCPv4OptRapidCommit     = 80
	DHCPv4OptDomainSearch    = 119
	DHCPv4OptClasslessRoutes = 121
	DHCPv4OptEnd             = 255
)

// DHCPv4 is a view of a DHCPv4 (BOOTP) message, the UDP payload.
type DHCPv4 []byte

// ParseDHCPv4 checks that b holds the fixed BOOTP fields and the magic
// cookie. The option list is validated lazily by NextDHCPv4Option.
func ParseDHCPv4(b []byte) (DHCPv4, error) {
	if len(b) < DHCPv4MinimumSize {
		return nil, ErrTruncated
	}
	if binary.BigEndian.Uint32(b[236:240]) != dhcpv4Magic {
		return nil, ErrBadMagic
	}
	return DHCPv4(b), nil
}

// Op returns the BOOTP op (DHCPv4OpRequest from clients).
func (m DHCPv4) Op() uint8 { return m[0] }

// HardwareType returns htype (1 for Ethernet).
func (m DHCPv4) HardwareType() uint8 { return m[1] }

// HardwareLen returns hlen (6 for Ethernet).
func (m DHCPv4) HardwareLen() uint8 { return m[2] }

// Hops returns the relay hop count.
func (m DHCPv4) Hops() uint8 { return m[3] }

// TransactionID returns xid.
func (m DHCPv4) TransactionID() uint32 { return binary.BigEndian.Uint32(m[4:8]) }

// Secs returns the seconds since the client began.
func (m DHCPv4) Secs() uint16 { return binary.BigEndian.Uint16(m[8:10]) }

// Flags returns the flags field.
func (m DHCPv4) Flags() uint16 { return binary.BigEndian.Uint16(m[10:12]) }

// Broadcast reports whether the client asked for broadcast replies.
func (m DHCPv4) Broadcast() bool { return m.Flags()&DHCPv4BroadcastFlag != 0 }

// ClientIP returns ciaddr.
func (m DHCPv4) ClientIP() netip.Addr { return netip.AddrFrom4([4]byte(m[12:16])) }

// YourIP returns yiaddr.
func (m DHCPv4) YourIP() netip.Addr { return netip.AddrFrom4([4]byte(m[16:20])) }

// ServerIP returns siaddr.
func (m DHCPv4) ServerIP() netip.Addr { return netip.AddrFrom4([4]byte(m[20:24])) }

// GatewayIP returns giaddr (relay agent).
func (m DHCPv4) GatewayIP() netip.Addr { return netip.AddrFrom4([4]byte(m[24:28])) }

// ClientMAC returns the first six bytes of chaddr.
func (m DHCPv4) ClientMAC() MAC { return MAC(m[28:34]) }

// Options returns the option bytes after the magic cookie.
func (m DHCPv4) Options() []byte { return m[dhcpv4OptionsAt:] }

// Option returns the data of the first option with the given code. It stops
// at End or at the first malformed option. Options split per RFC 3396 are
// not concatenated; the first piece is returned.
func (m DHCPv4) Option(code uint8) ([]byte, bool) {
	opts := m.Options()
	for {
		c, data, rest, ok, err := NextDHCPv4Option(opts)
		if !ok || err != nil {
			return nil, false
		}
		if c == code {
			return data, true
		}
		opts = rest
	}
}

// MessageType returns option 53, or 0 when it is missing or malformed.
func (m DHCPv4) MessageType() DHCPv4MessageType {
	d, ok := m.Option(DHCPv4OptMessageType)
	if !ok || len(d) != 1 {
		return 0
	}
	return DHCPv4MessageType(d[0])
}

// OptionAddr returns a four-byte address option (requested IP, server id).
func (m DHCPv4) OptionAddr(code uint8) (netip.Addr, bool) {
	d, ok := m.Option(code)
	if !ok || len(d) != 4 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(d)), true
}

// NextDHCPv4Option walks a DHCPv4 option list. It skips Pad bytes and
// returns the next option's code, data and the rest of the list. ok is false
// at End or when the list is exhausted; err is ErrBadOption when a length
// runs past the list.
func NextDHCPv4Option(opts []byte) (code uint8, data, rest []byte, ok bool, err error) {
	for len(opts) > 0 && opts[0] == DHCPv4OptPad {
		opts = opts[1:]
	}
	if len(opts) == 0 || opts[0] == DHCPv4OptEnd {
		return 0, nil, nil, false, nil
	}
	if len(opts) < 2 || int(opts[1]) > len(opts)-2 {
		return 0, nil, nil, false, ErrBadOption
	}
	l := 2 + int(opts[1])
	return opts[0], opts[2:l], opts[l:], true, nil
}

// DHCPv4Fields holds the fixed BOOTP fields of a reply.
type DHCPv4Fields struct {
	Op            uint8
	TransactionID uint32
	Secs          uint16
	Flags         uint16
	ClientIP      netip.Addr // ciaddr
	YourIP        netip.Addr // yiaddr
	ServerIP      netip.Addr // siaddr
	GatewayIP     netip.Addr // giaddr
	ClientMAC     MAC
}

// DHCPv4Builder writes a DHCPv4 message into a caller-provided buffer. Add*
// calls after the buffer filled up are ignored and make Finish report
// failure, so callers check once at the end.
type DHCPv4Builder struct {
	buf      []byte
	n        int
	overflow bool
	longCode uint8
	longLen  int // index of the current long option's length byte, -1 if none
}

// Reset starts a new message in b with the fixed fields of f and the magic
// cookie. The sname and file fields are zeroed.
func (w *DHCPv4Builder) Reset(b []byte, f *DHCPv4Fields) {
	*w = DHCPv4Builder{buf: b, longLen: -1}
	if len(b) < DHCPv4MinimumSize+1 {
		w.overflow = true
		return
	}
	clear(b[:DHCPv4MinimumSize])
	b[0], b[1], b[2] = f.Op, 1, 6
	binary.BigEndian.PutUint32(b[4:8], f.TransactionID)
	binary.BigEndian.PutUint16(b[8:10], f.Secs)
	binary.BigEndian.PutUint16(b[10:12], f.Flags)
	putAddr4(b[12:16], f.ClientIP)
	putAddr4(b[16:20], f.YourIP)
	putAddr4(b[20:24], f.ServerIP)
	putAddr4(b[24:28], f.GatewayIP)
	copy(b[28:34], f.ClientMAC[:])
	binary.BigEndian.PutUint32(b[236:240], dhcpv4Magic)
	w.n = DHCPv4MinimumSize
}

func putAddr4(b []byte, a netip.Addr) {
	v := as4(a)
	copy(b, v[:])
}

// room reports whether k more bytes fit while keeping one for End.
func (w *DHCPv4Builder) room(k int) bool {
	if w.overflow || w.n+k+1 > len(w.buf) {
		w.overflow = true
		return false
	}
	return true
}

// AddOption appends option code with data; data longer than 255 bytes is
// split into consecutive options of the same code (RFC 3396).
func (w *DHCPv4Builder) AddOption(code uint8, data []byte) {
	if len(data) == 0 {
		// Flag options such as Rapid Commit carry no data.
		if w.room(2) {
			w.buf[w.n], w.buf[w.n+1] = code, 0
			w.n += 2
		}
		return
	}
	w.beginLong(code)
	for _, c := range data {
		w.longByte(c)
	}
	w.endLong()
}

// AddOptionString appends an option whose data is the bytes of v (domain
// name, message); it avoids a []byte conversion that could allocate.
func (w *DHCPv4Builder) AddOptionString(code uint8, v string) {
	if len(v) == 0 {
		w.AddOption(code, nil)
		return
	}
	w.beginLong(code)
	for i := 0; i < len(v); i++ {
		w.longByte(v[i])
	}
	w.endLong()
}

// AddOptionByte appends a one-byte option (message type, for example).
func (w *DHCPv4Builder) AddOptionByte(code, v uint8) {
	if w.room(3) {
		w.buf[w.n], w.buf[w.n+1], w.buf[w.n+2] = code, 1, v
		w.n += 3
	}
}

// AddOptionUint16 appends a two-byte option (MTU, max message size).
func (w *DHCPv4Builder) AddOptionUint16(code uint8, v uint16) {
	if w.room(4) {
		w.buf[w.n], w.buf[w.n+1] = code, 2
		binary.BigEndian.PutUint16(w.buf[w.n+2:], v)
		w.n += 4
	}
}

// AddOptionUint32 appends a four-byte integer option (lease time).
func (w *DHCPv4Builder) AddOptionUint32(code uint8, v uint32) {
	if w.room(6) {
		w.buf[w.n], w.buf[w.n+1] = code, 4
		binary.BigEndian.PutUint32(w.buf[w.n+2:], v)
		w.n += 6
	}
}

// AddOptionAddrs appends an option holding the IPv4 addresses in addrs;
// non-IPv4 entries are skipped and nothing is written if none remain.
func (w *DHCPv4Builder) AddOptionAddrs(code uint8, addrs ...netip.Addr) {
	w.beginLong(code)
	for _, a := range addrs {
		if !a.Is4() {
			continue
		}
		v := a.As4()
		for _, c := range v {
			w.longByte(c)
		}
	}
	w.endLong()
}

// AddOptionDomainSearch appends option 119 (RFC 3397) listing names in
// uncompressed RFC 1035 encoding, split over several options when longer
// than 255 bytes. Names that cannot be encoded are skipped.
func (w *DHCPv4Builder) AddOptionDomainSearch(names []string) {
	var tmp [MaxDomainNameLength]byte
	w.beginLong(DHCPv4OptDomainSearch)
	for _, name := range names {
		n := EncodeDomainName(tmp[:], name)
		for _, c := range tmp[:n] {
			w.longByte(c)
		}
	}
	w.endLong()
}

func (w *DHCPv4Builder) beginLong(code uint8) { w.longCode, w.longLen = code, -1 }

func (w *DHCPv4Builder) longByte(c byte) {
	if w.longLen < 0 || w.buf[w.longLen] == 255 {
		if !w.room(3) {
			return
		}
		w.buf[w.n] = w.longCode
		w.buf[w.n+1] = 0
		w.longLen = w.n + 1
		w.n += 2
	} else if !w.room(1) {
		return
	}
	w.buf[w.n] = c
	w.buf[w.longLen]++
	w.n++
}

func (w *DHCPv4Builder) endLong() { w.longLen = -1 }

// Finish appends End, pads to DHCPv4MinimumReplySize when the buffer allows,
// and returns the message length; ok is false if anything did not fit.
func (w *DHCPv4Builder) Finish() (n int, ok bool) {
	if w.overflow || w.n >= len(w.buf) {
		return 0, false
	}
	w.buf[w.n] = DHCPv4OptEnd
	w.n++
	if w.n < DHCPv4MinimumReplySize && len(w.buf) >= DHCPv4MinimumReplySize {
		clear(w.buf[w.n:DHCPv4MinimumReplySize])
		w.n = DHCPv4MinimumReplySize
	}
	return w.n, true
}
