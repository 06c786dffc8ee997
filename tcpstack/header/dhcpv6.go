package header

import (
	"encoding/binary"
	"net/netip"
)

// DHCPv6 sizes and ports (RFC 8415).
const (
	// DHCPv6MinimumSize is the message type plus the transaction id.
	DHCPv6MinimumSize = 4
	// DHCPv6OptionHeaderSize is the code and length prefix of an option.
	DHCPv6OptionHeaderSize = 4
	DHCPv6ClientPort       = 546
	DHCPv6ServerPort       = 547
	// DHCPv6Infinity is the "infinite" lifetime or T1/T2 value.
	DHCPv6Infinity = 0xffffffff
	// dhcpv6MaxNesting bounds BeginOption nesting in the builder.
	dhcpv6MaxNesting = 4
)

// DHCPv6MessageType is the first byte of a DHCPv6 message.
type DHCPv6MessageType uint8

// DHCPv6 message types.
const (
	DHCPv6Solicit            DHCPv6MessageType = 1
	DHCPv6Advertise          DHCPv6MessageType = 2
	DHCPv6Request            DHCPv6MessageType = 3
	DHCPv6Confirm            DHCPv6MessageType = 4
	DHCPv6Renew              DHCPv6MessageType = 5
	DHCPv6Rebind             DHCPv6MessageType = 6
	DHCPv6Reply              DHCPv6MessageType = 7
	DHCPv6Release            DHCPv6MessageType = 8
	DHCPv6Decline            DHCPv6MessageType = 9
	DHCPv6Reconfigure        DHCPv6MessageType = 10
	DHCPv6InformationRequest DHCPv6MessageType = 11
	DHCPv6RelayForw          DHCPv6MessageType = 12
	DHCPv6RelayRepl          DHCPv6MessageType = 13
)

// DHCPv6 option codes.
const (
	DHCPv6OptClientID    = 1
	DHCPv6OptServerID    = 2
	DHCPv6OptIANA        = 3
	DHCPv6OptIATA        = 4
	DHCPv6OptIAAddr      = 5
	DHCPv6OptORO         = 6
	DHCPv6OptPreference  = 7
	DHCPv6OptElapsedTime = 8
	DHCPv6OptStatusCode  = 13
	DHCPv6OptRapidCommit = 14
	DHCPv6OptDNSServers  = 23
	DHCPv6OptDomainList  = 24
	DHCPv6OptIAPD        = 25
)

// DHCPv6 status codes (option 13).
const (
	DHCPv6StatusSuccess      = 0
	DHCPv6StatusUnspecFail   = 1
	DHCPv6StatusNoAddrsAvail = 2
	DHCPv6StatusNoBinding    = 3
	DHCPv6StatusNotOnLink    = 4
	DHCPv6StatusUseMulticast = 5
)

// DUID types (RFC 8415 11).
const (
	DUIDTypeLLT = 1
	DUIDTypeEN  = 2
	DUIDTypeLL  = 3
)

// DHCPv6 is a view of a client/server DHCPv6 message, the UDP payload.
type DHCPv6 []byte

// ParseDHCPv6 checks that b holds the message type and transaction id. The
// options are validated lazily by NextDHCPv6Option.
func ParseDHCPv6(b []byte) (DHCPv6, error) {
	if len(b) < DHCPv6MinimumSize {
		return nil, ErrTruncated
	}
	return DHCPv6(b), nil
}

// MessageType returns the message type.
func (m DHCPv6) MessageType() DHCPv6MessageType { return DHCPv6MessageType(m[0]) }

// TransactionID returns the 24-bit transaction id.
func (m DHCPv6) TransactionID() uint32 {
	return uint32(m[1])<<16 | uint32(m[2])<<8 | uint32(m[3])
}

// Options returns the option bytes.
func (m DHCPv6) Options() []byte { return m[DHCPv6MinimumSize:] }

// Option returns the first top-level option with code.
func (m DHCPv6) Option(code uint16) ([]byte, bool) { return FindDHCPv6Option(m.Options(), code) }

// NextDHCPv6Option walks a DHCPv6 option list (top level or the inside of an
// encapsulating option). ok is false when the list is exhausted; err is
// ErrBadOption when a header or length runs past the list.
func NextDHCPv6Option(opts []byte) (code uint16, data, rest []byte, ok bool, err error) {
	if len(opts) == 0 {
		return 0, nil, nil, false, nil
	}
	if len(opts) < DHCPv6OptionHeaderSize {
		return 0, nil, nil, false, ErrBadOption
	}
	l := int(binary.BigEndian.Uint16(opts[2:4]))
	if l > len(opts)-DHCPv6OptionHeaderSize {
		return 0, nil, nil, false, ErrBadOption
	}
	end := DHCPv6OptionHeaderSize + l
	return binary.BigEndian.Uint16(opts[0:2]), opts[DHCPv6OptionHeaderSize:end], opts[end:], true, nil
}

// FindDHCPv6Option returns the data of the first option with code in opts,
// stopping at the first malformed option.
func FindDHCPv6Option(opts []byte, code uint16) ([]byte, bool) {
	for {
		c, data, rest, ok, err := NextDHCPv6Option(opts)
		if !ok || err != nil {
			return nil, false
		}
		if c == code {
			return data, true
		}
		opts = rest
	}
}

// DHCPv6IANASize is the fixed part of an IA_NA option's data.
const DHCPv6IANASize = 12

// DHCPv6IANA is a view of an IA_NA option's data (IAID, T1, T2, options).
type DHCPv6IANA []byte

// ParseDHCPv6IANA checks the fixed IA_NA fields are present.
func ParseDHCPv6IANA(b []byte) (DHCPv6IANA, error) {
	if len(b) < DHCPv6IANASize {
		return nil, ErrTruncated
	}
	return DHCPv6IANA(b), nil
}

// IAID returns the identity association id.
func (ia DHCPv6IANA) IAID() uint32 { return binary.BigEndian.Uint32(ia[0:4]) }

// T1 returns the renew time.
func (ia DHCPv6IANA) T1() uint32 { return binary.BigEndian.Uint32(ia[4:8]) }

// T2 returns the rebind time.
func (ia DHCPv6IANA) T2() uint32 { return binary.BigEndian.Uint32(ia[8:12]) }

// Options returns the encapsulated options (IAADDR, status code).
func (ia DHCPv6IANA) Options() []byte { return ia[DHCPv6IANASize:] }

// DHCPv6IAAddrSize is the fixed part of an IAADDR option's data.
const DHCPv6IAAddrSize = 24

// DHCPv6IAAddr is a view of an IAADDR option's data.
type DHCPv6IAAddr []byte

// ParseDHCPv6IAAddr checks the fixed IAADDR fields are present.
func ParseDHCPv6IAAddr(b []byte) (DHCPv6IAAddr, error) {
	if len(b) < DHCPv6IAAddrSize {
		return nil, ErrTruncated
	}
	return DHCPv6IAAddr(b), nil
}

// Address returns the IPv6 address.
func (a DHCPv6IAAddr) Address() netip.Addr { return netip.AddrFrom16([16]byte(a[0:16])) }

// PreferredLifetime returns the preferred lifetime in seconds.
func (a DHCPv6IAAddr) PreferredLifetime() uint32 { return binary.BigEndian.Uint32(a[16:20]) }

// ValidLifetime returns the valid lifetime in seconds.
func (a DHCPv6IAAddr) ValidLifetime() uint32 { return binary.BigEndian.Uint32(a[20:24]) }

// Options returns the encapsulated options.
func (a DHCPv6IAAddr) Options() []byte { return a[DHCPv6IAAddrSize:] }

// DHCPv6Builder writes a DHCPv6 message into a caller-provided buffer.
// Options can nest (IA_NA holding IAADDR) with BeginOption/EndOption. Writes
// that do not fit are dropped and make Finish report failure.
type DHCPv6Builder struct {
	buf      []byte
	n        int
	overflow bool
	open     [dhcpv6MaxNesting]int
	depth    int
}

// Reset starts a message of type t with transaction id xid (24 bits) in b.
func (w *DHCPv6Builder) Reset(b []byte, t DHCPv6MessageType, xid uint32) {
	*w = DHCPv6Builder{buf: b}
	if len(b) < DHCPv6MinimumSize {
		w.overflow = true
		return
	}
	b[0], b[1], b[2], b[3] = uint8(t), uint8(xid>>16), uint8(xid>>8), uint8(xid)
	w.n = DHCPv6MinimumSize
}

func (w *DHCPv6Builder) room(k int) bool {
	if w.overflow || w.n+k > len(w.buf) {
		w.overflow = true
		return false
	}
	return true
}

// BeginOption opens an option whose data is the bytes written until the
// matching EndOption (use it for IA_NA, IAADDR and status codes).
func (w *DHCPv6Builder) BeginOption(code uint16) {
	if w.depth == dhcpv6MaxNesting {
		w.overflow = true
		return
	}
	if !w.room(DHCPv6OptionHeaderSize) {
		return
	}
	binary.BigEndian.PutUint16(w.buf[w.n:], code)
	w.open[w.depth] = w.n
	w.depth++
	w.n += DHCPv6OptionHeaderSize
}

// EndOption closes the innermost open option, filling in its length.
func (w *DHCPv6Builder) EndOption() {
	if w.depth == 0 {
		w.overflow = true
		return
	}
	w.depth--
	start := w.open[w.depth]
	if !w.overflow {
		binary.BigEndian.PutUint16(w.buf[start+2:], uint16(w.n-start-DHCPv6OptionHeaderSize))
	}
}

// Write appends raw bytes to the open option.
func (w *DHCPv6Builder) Write(data []byte) {
	if w.room(len(data)) {
		w.n += copy(w.buf[w.n:], data)
	}
}

// WriteUint32 appends a big-endian 32-bit value to the open option.
func (w *DHCPv6Builder) WriteUint32(v uint32) {
	if w.room(4) {
		binary.BigEndian.PutUint32(w.buf[w.n:], v)
		w.n += 4
	}
}

// WriteUint16 appends a big-endian 16-bit value to the open option.
func (w *DHCPv6Builder) WriteUint16(v uint16) {
	if w.room(2) {
		binary.BigEndian.PutUint16(w.buf[w.n:], v)
		w.n += 2
	}
}

// WriteAddr appends a 16-byte IPv6 address to the open option.
func (w *DHCPv6Builder) WriteAddr(a netip.Addr) {
	v := a.As16()
	w.Write(v[:])
}

// AddOption appends a complete option.
func (w *DHCPv6Builder) AddOption(code uint16, data []byte) {
	w.BeginOption(code)
	w.Write(data)
	w.EndOption()
}

// AddOptionAddrs appends an option listing the IPv6 addresses in addrs (DNS
// servers); IPv4 entries are skipped and nothing is written if none remain.
func (w *DHCPv6Builder) AddOptionAddrs(code uint16, addrs ...netip.Addr) {
	have := false
	for _, a := range addrs {
		if a.Is6() && !a.Is4In6() {
			have = true
		}
	}
	if !have {
		return
	}
	w.BeginOption(code)
	for _, a := range addrs {
		if a.Is6() && !a.Is4In6() {
			w.WriteAddr(a)
		}
	}
	w.EndOption()
}

// AddOptionDomainList appends a domain list option (24, RFC 3646) in
// uncompressed RFC 1035 encoding; invalid names are skipped and nothing is
// written if none remain.
func (w *DHCPv6Builder) AddOptionDomainList(code uint16, names []string) {
	have := false
	for _, name := range names {
		if DomainNameEncodedLen(name) > 1 {
			have = true
		}
	}
	if !have {
		return
	}
	w.BeginOption(code)
	for _, name := range names {
		if l := DomainNameEncodedLen(name); l > 1 && w.room(l) {
			w.n += EncodeDomainName(w.buf[w.n:], name)
		}
	}
	w.EndOption()
}

// AddStatusCode appends a status code option with a message.
func (w *DHCPv6Builder) AddStatusCode(status uint16, msg string) {
	w.BeginOption(DHCPv6OptStatusCode)
	w.WriteUint16(status)
	if w.room(len(msg)) {
		w.n += copy(w.buf[w.n:], msg)
	}
	w.EndOption()
}

// Finish returns the message length; ok is false if anything did not fit or
// an option was left open.
func (w *DHCPv6Builder) Finish() (n int, ok bool) {
	if w.overflow || w.depth != 0 {
		return 0, false
	}
	return w.n, true
}

// EncodeDUIDLL writes a DUID-LL (type 3, hardware type 1, mac) into b and
// returns its length (10), or 0 when b is too short.
func EncodeDUIDLL(b []byte, mac MAC) int {
	if len(b) < 10 {
		return 0
	}
	binary.BigEndian.PutUint16(b[0:2], DUIDTypeLL)
	binary.BigEndian.PutUint16(b[2:4], 1)
	copy(b[4:10], mac[:])
	return 10
}
