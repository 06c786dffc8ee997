package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"vunet/cmd/vunet/portspec"
	"vunet/tcpstack/header"
)

// flag.Value types. The standard ones cannot be shared between several
// spellings of one option without double defaults in --help, and the
// repeatable, per-family options need their own merge rules.

type stringValue string

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }

type boolValue bool

func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	*v = boolValue(b)
	return nil
}

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 32)
	if err != nil {
		return fmt.Errorf("want an integer")
	}
	*v = intValue(n)
	return nil
}

type durationValue time.Duration

func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 30s or 5m")
	}
	*v = durationValue(d)
	return nil
}

// fileMode parses an octal permission such as 0660.
type fileMode struct{ m *os.FileMode }

func (f fileMode) String() string {
	if f.m == nil {
		return ""
	}
	return fmt.Sprintf("%#o", uint32(*f.m))
}

func (f fileMode) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return fmt.Errorf("want an octal mode such as 0660")
	}
	*f.m = os.FileMode(v)
	return nil
}

// addrValue is an optional address: the zero value means "not given".
type addrValue = netip.Addr

func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("not an IP address")
	}
	return a.Unmap(), nil
}

// addrUsable is passt's rule for guest, gateway and outbound addresses: a
// unicast address that is neither unspecified nor loopback.
func addrUsable(a netip.Addr) error {
	switch {
	case a.IsUnspecified():
		return fmt.Errorf("unspecified address")
	case a.IsLoopback():
		return fmt.Errorf("loopback address")
	case a.IsMulticast():
		return fmt.Errorf("multicast address")
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("broadcast address")
	}
	return nil
}

// addrAny accepts any specified address (resolvers may be loopback).
func addrAny(a netip.Addr) error {
	if a.IsUnspecified() {
		return fmt.Errorf("unspecified address")
	}
	return nil
}

// familyAddr is an option that holds one address per family, like passt's
// -a, -g, -o and --dns-forward: a later one of the same family replaces
// the earlier (passt's getopt loop overwrites it).
type familyAddr struct {
	v4, v6 *netip.Addr
	name   string
	check  func(netip.Addr) error
}

func (f familyAddr) String() string {
	if f.v4 == nil {
		return ""
	}
	var s []string
	for _, a := range []netip.Addr{*f.v4, *f.v6} {
		if a.IsValid() {
			s = append(s, a.String())
		}
	}
	return strings.Join(s, ",")
}

func (f familyAddr) Set(s string) error {
	a, err := parseAddr(s)
	if err != nil {
		return err
	}
	if err := f.check(a); err != nil {
		return err
	}
	if a.Is4() {
		*f.v4 = a
	} else {
		*f.v6 = a
	}
	return nil
}

// guestAddr is -a: ADDR or, as newer passt accepts, ADDR/PREFIXLEN. An
// IPv4 prefix length is the netmask (-n with it is passt's "redundant
// prefix length" error); an IPv6 one sets the advertised prefix.
type guestAddr struct{ o *options }

func (g guestAddr) String() string {
	if g.o == nil {
		return ""
	}
	return familyAddr{v4: &g.o.addr4, v6: &g.o.addr6}.String()
}

func (g guestAddr) Set(s string) error {
	addr, bits, hasPrefix := strings.Cut(s, "/")
	a, err := parseAddr(addr)
	if err != nil {
		return err
	}
	if err := addrUsable(a); err != nil {
		return err
	}
	plen := -1
	if hasPrefix {
		n, err := strconv.Atoi(bits)
		if err != nil || n < 1 || n > a.BitLen() {
			return fmt.Errorf("prefix length out of 1..%d", a.BitLen())
		}
		plen = n
	}
	if a.Is4() {
		if plen >= 0 && g.o.netmaskGiven {
			return fmt.Errorf("redundant prefix length: --netmask also given")
		}
		g.o.addr4, g.o.addr4Prefix = a, hasPrefix
		if hasPrefix {
			g.o.prefix4 = plen
		}
		return nil
	}
	g.o.addr6, g.o.prefix6 = a, plen
	return nil
}

// netmaskValue parses -n: dotted quad or prefix length.
type netmaskValue struct{ o *options }

func (n netmaskValue) String() string {
	if n.o == nil || n.o.prefix4 < 0 {
		return ""
	}
	return strconv.Itoa(n.o.prefix4)
}

func (n netmaskValue) Set(s string) error {
	if n.o.addr4Prefix {
		return fmt.Errorf("redundant prefix length: --address gave one")
	}
	bits, err := parseNetmask(s)
	if err != nil {
		return err
	}
	n.o.prefix4, n.o.netmaskGiven = bits, true
	return nil
}

func parseNetmask(s string) (int, error) {
	if b, err := strconv.Atoi(s); err == nil {
		if b < 1 || b > 32 {
			return 0, fmt.Errorf("prefix length out of 1..32")
		}
		return b, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return 0, fmt.Errorf("want a dotted netmask or a prefix length")
	}
	m := a.As4()
	ones, total := net.IPMask(m[:]).Size()
	if total == 0 || ones == 0 {
		return 0, fmt.Errorf("not a contiguous netmask")
	}
	return ones, nil
}

// macValue is an optional MAC address.
type macValue struct {
	mac header.MAC
	ok  bool
}

func (m *macValue) String() string {
	if !m.ok {
		return ""
	}
	return m.mac.String()
}

func (m *macValue) Set(s string) error {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("want a MAC address such as 9a:55:9a:55:9a:55")
	}
	copy(m.mac[:], hw)
	if m.mac.IsZero() || m.mac.IsMulticast() {
		return fmt.Errorf("not a unicast MAC address")
	}
	m.ok = true
	return nil
}

// addrList is a repeatable address option.
type addrList []netip.Addr

// dnsValue is -D: repeatable, "none" clears the resolvers.
type dnsValue struct{ o *options }

func (d dnsValue) String() string {
	if d.o == nil {
		return ""
	}
	if d.o.dnsNone {
		return "none"
	}
	var s []string
	for _, a := range d.o.dns {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

func (d dnsValue) Set(s string) error {
	if s == "none" {
		// passt: "none" empties the list; a later address starts a new one.
		d.o.dnsNone, d.o.dns = true, nil
		return nil
	}
	a, err := parseAddr(s)
	if err != nil {
		return err
	}
	if err := addrAny(a); err != nil {
		return err
	}
	d.o.dnsNone = false
	d.o.dns = append(d.o.dns, a)
	return nil
}

// searchValue is -S: repeatable, each a space-separated list of domains
// (QEMU's -netdev passt,search= passes them that way); "none" clears the
// list and a later domain starts a new one.
type searchValue struct{ o *options }

func (v searchValue) String() string {
	if v.o == nil {
		return ""
	}
	return strings.Join(v.o.search, " ")
}

func (v searchValue) Set(s string) error {
	if s == "none" {
		v.o.searchNone, v.o.search = true, nil
		return nil
	}
	if len(strings.Fields(s)) == 0 {
		return fmt.Errorf("empty search list")
	}
	for _, d := range strings.Fields(s) {
		if err := checkDomain(d); err != nil {
			return fmt.Errorf("domain %q: %w", d, err)
		}
	}
	v.o.searchNone = false
	v.o.search = append(v.o.search, strings.Fields(s)...)
	return nil
}

// checkDomain accepts what DHCP option 119 can carry: labels of 1..63
// bytes, 253 bytes in all, a trailing dot allowed.
func checkDomain(d string) error {
	d = strings.TrimSuffix(d, ".")
	if d == "" || len(d) > 253 {
		return fmt.Errorf("length out of 1..253")
	}
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("label length out of 1..63")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("character %q not allowed", c)
			}
		}
	}
	return nil
}

// portsValue is -t/-u: repeatable passt port specifications.
type portsValue struct{ set *portspec.Set }

func (p portsValue) String() string {
	if p.set == nil {
		return ""
	}
	return p.set.String()
}

func (p portsValue) Set(s string) error { return p.set.Add(s) }
