// Package header parses and builds the wire formats vunet's translation core
// meets on the guest's link: Ethernet, ARP, IPv4, IPv6 (with extension
// headers), ICMPv4, ICMPv6 with NDP, UDP, TCP (with options), DHCPv4 and
// DHCPv6, plus the Internet checksum in its full, pseudo-header and
// incremental forms.
//
// ParseFrame is the data path's one parse of a guest frame: Ethernet, IP
// (IPv6 extension headers walked to the upper layer) and the TCP header,
// into a Packet that dispatch hands to whoever handles the frame. The
// iovec helpers read, write and checksum a frame scattered over guest
// buffers as if it were one slice.
//
// The style follows gVisor's pkg/tcpip/header: each format is a view type over
// a []byte with accessor methods, so parsing never copies and never allocates.
// Parse functions validate every length the bytes claim before a view is
// handed out, because the bytes come from an untrusted guest; accessors on a
// view returned by a Parse function are then safe to call. Builders write into
// a caller-provided buffer and report how many bytes they wrote (or false
// when the buffer is too small); they never grow a slice.
//
// The package is a leaf: it must not import any other vunet package, nor do
// any I/O, so it can be fuzzed and benchmarked in isolation.
package header
