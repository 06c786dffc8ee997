package portspec

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Mode is what kind of specification an option gave. The order matters:
// specific ports (ModePorts) may be combined over repeated options, the
// others may not be combined with anything (passt's rule).
type Mode uint8

const (
	// ModeUnset: no -t/-u given; nothing is forwarded.
	ModeUnset Mode = iota
	// ModePorts: explicit ports or ranges, possibly remapped or excluded.
	ModePorts
	// ModeNone: forward nothing ("none", passt's default).
	ModeNone
	// ModeAuto: "auto". passt accepts it only in pasta mode (ports follow
	// a namespace's listening sockets); a vhost-user back-end has no
	// namespace to watch, so it forwards nothing, like "none".
	ModeAuto
	// ModeAll: every non-ephemeral port 1..65535 ("all").
	ModeAll
)

// String names the mode as on the command line.
func (m Mode) String() string {
	switch m {
	case ModeUnset:
		return "unset"
	case ModePorts:
		return "ports"
	case ModeNone:
		return "none"
	case ModeAuto:
		return "auto"
	case ModeAll:
		return "all"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Range is an inclusive, non-empty port range.
type Range struct{ First, Last uint16 }

// Len returns the number of ports in r.
func (r Range) Len() int { return int(r.Last) - int(r.First) + 1 }

// Contains reports whether p is in r.
func (r Range) Contains(p uint16) bool { return p >= r.First && p <= r.Last }

// String renders r in port-spec syntax ("22" or "8000-8010").
func (r Range) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Mapping forwards the host ports Host to the guest ports starting at
// Guest (Guest+i for Host.First+i).
type Mapping struct {
	Host  Range
	Guest uint16
}

// String renders m in port-spec syntax ("22", "2222:22", "1-2:11-12").
func (m Mapping) String() string {
	if m.Guest == m.Host.First {
		return m.Host.String()
	}
	return m.Host.String() + ":" + Range{m.Guest, m.Guest + (m.Host.Last - m.Host.First)}.String()
}

// Spec is one parsed -t/-u argument.
type Spec struct {
	Mode Mode
	// Addr is the host address to bind; invalid means every address.
	Addr netip.Addr
	// Iface restricts the listening sockets to a host interface
	// (SO_BINDTODEVICE); empty means any.
	Iface string
	// Ports are the explicit mappings in the order given, exclusions not
	// yet applied (Forwards applies them).
	Ports []Mapping
	// Exclude lists the "~" ranges. With no Ports they mean "every
	// non-ephemeral port except these".
	Exclude []Range
	// All is "ADDR/all" or "%IF/all": every non-ephemeral port on that
	// bind address or interface (newer passt; libvirt writes it for a
	// <portForward address=…> without ranges).
	All bool
}

// ExcludeOnly reports whether s forwards every non-ephemeral port but its
// exclusions (if any): an exclusion-only list or ADDR/all.
func (s *Spec) ExcludeOnly() bool {
	return s.Mode == ModePorts && len(s.Ports) == 0 && (len(s.Exclude) > 0 || s.All)
}

// maxSpecLen bounds an argument; passt's own buffer is BUFSIZ.
const maxSpecLen = 8192

// ifNameMax is IFNAMSIZ minus the terminating NUL.
const ifNameMax = 15

// Errors Parse wraps, so callers and tests can tell them apart.
var (
	ErrSyntax  = errors.New("invalid port specifier")
	ErrOverlap = errors.New("overlapping excluded ranges")
)

// Parse parses one -t/-u argument.
func Parse(arg string) (Spec, error) {
	switch arg {
	case "none":
		return Spec{Mode: ModeNone}, nil
	case "auto":
		return Spec{Mode: ModeAuto}, nil
	case "all":
		return Spec{Mode: ModeAll}, nil
	}
	bad := func(why string) (Spec, error) {
		return Spec{}, fmt.Errorf("%w %q: %s", ErrSyntax, arg, why)
	}
	if len(arg) > maxSpecLen {
		return bad("too long")
	}
	s := Spec{Mode: ModePorts}
	list := arg
	if i := strings.IndexByte(arg, '/'); i >= 0 {
		prefix := arg[:i]
		list = arg[i+1:]
		addr := prefix
		if j := strings.IndexByte(prefix, '%'); j >= 0 {
			addr, s.Iface = prefix[:j], prefix[j+1:]
			if s.Iface == "" {
				return bad("empty interface name after %")
			}
			if len(s.Iface) > ifNameMax || strings.ContainsAny(s.Iface, "/ \t\n\x00:") {
				return bad("interface name " + strconv.Quote(s.Iface) + " is not valid")
			}
		}
		if addr == "" && s.Iface == "" {
			return bad("empty address before /")
		}
		if addr != "" {
			// passt allows brackets around either family for convenience.
			if len(addr) >= 2 && addr[0] == '[' && addr[len(addr)-1] == ']' {
				addr = addr[1 : len(addr)-1]
			}
			a, err := netip.ParseAddr(addr)
			if err != nil || a.Zone() != "" {
				return bad("bind address " + strconv.Quote(addr) + " is not an IP address")
			}
			s.Addr = a.Unmap()
		}
	}
	if list == "" {
		return bad("no ports")
	}
	if list == "all" && list != arg {
		s.All = true
		return s, nil
	}
	for _, chunk := range strings.Split(list, ",") {
		if rest, ok := strings.CutPrefix(chunk, "~"); ok {
			r, err := parseRange(rest)
			if err != nil {
				return bad(err.Error())
			}
			for _, x := range s.Exclude {
				if x.First <= r.Last && r.First <= x.Last {
					return Spec{}, fmt.Errorf("%w in %q: %v and %v", ErrOverlap, arg, x, r)
				}
			}
			s.Exclude = append(s.Exclude, r)
			continue
		}
		hostPart, guestPart, remap := strings.Cut(chunk, ":")
		host, err := parseRange(hostPart)
		if err != nil {
			return bad(err.Error())
		}
		m := Mapping{Host: host, Guest: host.First}
		if remap {
			guest, err := parseRange(guestPart)
			if err != nil {
				return bad(err.Error())
			}
			if guest.Len() != host.Len() {
				return bad(fmt.Sprintf("%v and %v differ in size", host, guest))
			}
			m.Guest = guest.First
		}
		s.Ports = append(s.Ports, m)
	}
	return s, nil
}

// parseRange parses "N" or "N-M" with 1 <= N <= M <= 65535. Port 0 is
// refused: it means "any port" to the socket API.
func parseRange(s string) (Range, error) {
	a, b, isRange := strings.Cut(s, "-")
	first, err := parsePort(a)
	if err != nil {
		return Range{}, err
	}
	last := first
	if isRange {
		if last, err = parsePort(b); err != nil {
			return Range{}, err
		}
	}
	if last < first {
		return Range{}, fmt.Errorf("range %d-%d is reversed", first, last)
	}
	return Range{first, last}, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, errors.New("missing port number")
	}
	if len(s) > 5 {
		return 0, fmt.Errorf("port %q out of range", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a port number", s)
		}
	}
	n, _ := strconv.Atoi(s)
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d out of range 1..65535", n)
	}
	return uint16(n), nil
}
