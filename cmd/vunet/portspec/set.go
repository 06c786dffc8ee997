package portspec

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrModeConflict reports a repeated option mixing "all", "none", "auto"
// or specific ports, which passt refuses too.
var ErrModeConflict = errors.New("port forwarding mode conflicts with a previous option")

// Set accumulates the repeated -t (or -u) options of one command line.
// The zero Set forwards nothing.
type Set struct {
	Mode  Mode
	Specs []Spec // ModePorts specs in the order given
	args  []string
}

// Add parses arg and merges it with the options seen so far: any number
// of specific-port options combine; "all", "none" and "auto" stand alone.
func (s *Set) Add(arg string) error {
	sp, err := Parse(arg)
	if err != nil {
		return err
	}
	switch {
	case sp.Mode == ModePorts && s.Mode > ModePorts:
		return fmt.Errorf("%w: %q with %q (specific ports cannot be combined with all/none/auto)", ErrModeConflict, arg, s.Mode.String())
	case sp.Mode != ModePorts && s.Mode != ModeUnset:
		return fmt.Errorf("%w: %q after %q", ErrModeConflict, arg, strings.Join(s.args, ","))
	}
	s.Mode = sp.Mode
	s.args = append(s.args, arg)
	if sp.Mode == ModePorts {
		s.Specs = append(s.Specs, sp)
	}
	return nil
}

// Enabled reports whether the set forwards any port.
func (s *Set) Enabled() bool { return s.Mode == ModePorts || s.Mode == ModeAll }

// String returns the options as given, comma-joined ("" when unset), for
// logs.
func (s *Set) String() string { return strings.Join(s.args, " ") }

// Forward is one contiguous forwarded range after expansion.
type Forward struct {
	Addr  netip.Addr // bind address; invalid = any
	Iface string     // bind interface; empty = any
	Host  Range
	Guest uint16 // guest port of Host.First
}

// String renders f in port-spec syntax, bind address and interface
// included, so that it parses back to the same forward.
func (f Forward) String() string {
	var b strings.Builder
	if f.Addr.IsValid() {
		if f.Addr.Is6() {
			b.WriteString("[" + f.Addr.String() + "]")
		} else {
			b.WriteString(f.Addr.String())
		}
	}
	if f.Iface != "" {
		b.WriteString("%" + f.Iface)
	}
	if b.Len() > 0 {
		b.WriteByte('/')
	}
	b.WriteString(Mapping{Host: f.Host, Guest: f.Guest}.String())
	return b.String()
}

// DefaultEphemeral is the range RFC 6335 suggests for ephemeral ports,
// used when the kernel's ip_local_port_range cannot be read.
var DefaultEphemeral = Range{49152, 65535}

type bindKey struct {
	addr  netip.Addr
	iface string
}

// Forwards expands the set into contiguous host→guest ranges. "all" and
// exclusion-only specs cover 1..65535 except the ephemeral range (ports
// the kernel hands out for outgoing connections, not for services, as in
// passt). A port mapped twice on the same bind address keeps the later
// mapping (passt warns and does the same). Ranges come out ordered by
// bind address (first use) and port.
func (s *Set) Forwards(ephemeral Range) []Forward {
	var keys []bindKey
	maps := map[bindKey]*[65536]int32{}
	table := func(k bindKey) *[65536]int32 {
		t := maps[k]
		if t == nil {
			t = new([65536]int32)
			for i := range t {
				t[i] = -1
			}
			maps[k] = t
			keys = append(keys, k)
		}
		return t
	}
	excluded := func(sp *Spec, p uint16) bool {
		for _, x := range sp.Exclude {
			if x.Contains(p) {
				return true
			}
		}
		return false
	}
	switch s.Mode {
	case ModeAll:
		t := table(bindKey{})
		for p := 1; p <= 65535; p++ {
			if !ephemeral.Contains(uint16(p)) {
				t[p] = int32(p)
			}
		}
	case ModePorts:
		for i := range s.Specs {
			sp := &s.Specs[i]
			t := table(bindKey{sp.Addr, sp.Iface})
			if sp.ExcludeOnly() {
				for p := 1; p <= 65535; p++ {
					if !ephemeral.Contains(uint16(p)) && !excluded(sp, uint16(p)) {
						t[p] = int32(p)
					}
				}
				continue
			}
			for _, m := range sp.Ports {
				for p := int(m.Host.First); p <= int(m.Host.Last); p++ {
					if !excluded(sp, uint16(p)) {
						t[p] = int32(int(m.Guest) + p - int(m.Host.First))
					}
				}
			}
		}
	}
	var out []Forward
	for _, k := range keys {
		t := maps[k]
		for p := 1; p <= 65535; p++ {
			if t[p] < 0 {
				continue
			}
			f := Forward{Addr: k.addr, Iface: k.iface, Host: Range{uint16(p), uint16(p)}, Guest: uint16(t[p])}
			for p+1 <= 65535 && t[p+1] >= 0 && t[p+1] == t[p]+1 {
				p++
			}
			f.Host.Last = uint16(p)
			out = append(out, f)
		}
	}
	return out
}
