package portspec

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		in   string
		want Spec
	}{
		{"none", Spec{Mode: ModeNone}},
		{"auto", Spec{Mode: ModeAuto}},
		{"all", Spec{Mode: ModeAll}},
		{"22", Spec{Mode: ModePorts, Ports: []Mapping{{Range{22, 22}, 22}}}},
		{"22,80", Spec{Mode: ModePorts, Ports: []Mapping{{Range{22, 22}, 22}, {Range{80, 80}, 80}}}},
		{"8000-8010", Spec{Mode: ModePorts, Ports: []Mapping{{Range{8000, 8010}, 8000}}}},
		{"2222:22", Spec{Mode: ModePorts, Ports: []Mapping{{Range{2222, 2222}, 22}}}},
		{"22-80:32-90", Spec{Mode: ModePorts, Ports: []Mapping{{Range{22, 80}, 32}}}},
		{"65535", Spec{Mode: ModePorts, Ports: []Mapping{{Range{65535, 65535}, 65535}}}},
		{"192.0.2.1/22", Spec{Mode: ModePorts, Addr: a("192.0.2.1"), Ports: []Mapping{{Range{22, 22}, 22}}}},
		{"[192.0.2.1]/22", Spec{Mode: ModePorts, Addr: a("192.0.2.1"), Ports: []Mapping{{Range{22, 22}, 22}}}},
		{"::1/22", Spec{Mode: ModePorts, Addr: a("::1"), Ports: []Mapping{{Range{22, 22}, 22}}}},
		{"[2001:db8::1]/443:8443", Spec{Mode: ModePorts, Addr: a("2001:db8::1"), Ports: []Mapping{{Range{443, 443}, 8443}}}},
		{"192.0.2.1%eth0/22", Spec{Mode: ModePorts, Addr: a("192.0.2.1"), Iface: "eth0", Ports: []Mapping{{Range{22, 22}, 22}}}},
		{"%eth0/22", Spec{Mode: ModePorts, Iface: "eth0", Ports: []Mapping{{Range{22, 22}, 22}}}},
		{"2000-5000,~3000-3010", Spec{Mode: ModePorts, Ports: []Mapping{{Range{2000, 5000}, 2000}}, Exclude: []Range{{3000, 3010}}}},
		{"~25,192-193", Spec{Mode: ModePorts, Ports: []Mapping{{Range{192, 193}, 192}}, Exclude: []Range{{25, 25}}}},
		{"~20000-20010", Spec{Mode: ModePorts, Exclude: []Range{{20000, 20010}}}},
		{"::ffff:192.0.2.1/22", Spec{Mode: ModePorts, Addr: a("192.0.2.1"), Ports: []Mapping{{Range{22, 22}, 22}}}},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "no ports"},
		{"0", "out of range"},
		{"65536", "out of range"},
		{"123456", "out of range"},
		{"80-22", "reversed"},
		{"22-", "missing port"},
		{"-22", "missing port"},
		{"22,,80", "missing port"},
		{"22,", "missing port"},
		{"22:", "missing port"},
		{"22-80:32-91", "differ in size"},
		{"22:23:24", "not a port number"},
		{"+22", "not a port number"},
		{" 22", "not a port number"},
		{"http", "not a port number"},
		{"/22", "empty address"},
		{"192.0.2.1/", "no ports"},
		{"192.0.2.1/all,22", "not a port number"},
		{"192.0.2.1/~all", "not a port number"},
		{"300.1.1.1/22", "not an IP address"},
		{"fe80::1%eth0/22", "not an IP address"}, // fe80::1 then "%eth0" is the interface: fe80::1 alone is valid
		{"%/22", "empty interface"},
		{"%averyveryverylongname/22", "not valid"},
		{"~1-10,~5", "overlapping"},
		{"~", "missing port"},
		{"all,22", "not a port number"},
		{strings.Repeat("1,", 5000), "too long"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.in)
		if tt.in == "fe80::1%eth0/22" {
			// A bind address with an interface is valid syntax.
			if err != nil {
				t.Errorf("Parse(%q): %v", tt.in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) err = %v, want containing %q", tt.in, err, tt.want)
		}
	}
	if _, err := Parse("~1-10,~5"); !errors.Is(err, ErrOverlap) {
		t.Errorf("overlap: %v is not ErrOverlap", err)
	}
	if _, err := Parse("x"); !errors.Is(err, ErrSyntax) {
		t.Errorf("syntax: %v is not ErrSyntax", err)
	}
}

func TestSetModes(t *testing.T) {
	tests := []struct {
		args    []string
		mode    Mode
		wantErr bool
	}{
		{[]string{"22", "80"}, ModePorts, false},
		{[]string{"none"}, ModeNone, false},
		{[]string{"all"}, ModeAll, false},
		{[]string{"auto"}, ModeAuto, false},
		{[]string{"none", "22"}, 0, true},
		{[]string{"22", "none"}, 0, true},
		{[]string{"all", "none"}, 0, true},
		{[]string{"all", "all"}, 0, true},
		{[]string{"22", "all"}, 0, true},
		{[]string{"auto", "80"}, 0, true},
	}
	for _, tt := range tests {
		var s Set
		var err error
		for _, a := range tt.args {
			if err = s.Add(a); err != nil {
				break
			}
		}
		if tt.wantErr {
			if !errors.Is(err, ErrModeConflict) {
				t.Errorf("%q: err = %v, want ErrModeConflict", tt.args, err)
			}
			continue
		}
		if err != nil || s.Mode != tt.mode {
			t.Errorf("%q: mode %v err %v, want %v", tt.args, s.Mode, err, tt.mode)
		}
	}
}

func TestForwards(t *testing.T) {
	eph := Range{32768, 60999}
	a := netip.MustParseAddr
	tests := []struct {
		args []string
		want []Forward
	}{
		{nil, nil},
		{[]string{"none"}, nil},
		{[]string{"auto"}, nil},
		{[]string{"22"}, []Forward{{Host: Range{22, 22}, Guest: 22}}},
		{[]string{"22", "80"}, []Forward{{Host: Range{22, 22}, Guest: 22}, {Host: Range{80, 80}, Guest: 80}}},
		{[]string{"2222:22"}, []Forward{{Host: Range{2222, 2222}, Guest: 22}}},
		// A range remapped stays one contiguous forward.
		{[]string{"8000-8010:9000-9010"}, []Forward{{Host: Range{8000, 8010}, Guest: 9000}}},
		// Exclusions split a range, with the remapping kept.
		{[]string{"20-30:120-130,~25"}, []Forward{{Host: Range{20, 24}, Guest: 120}, {Host: Range{26, 30}, Guest: 126}}},
		// Adjacent ports that map discontiguously are separate ranges.
		{[]string{"10:20,11:40"}, []Forward{{Host: Range{10, 10}, Guest: 20}, {Host: Range{11, 11}, Guest: 40}}},
		// Later mapping of the same port wins.
		{[]string{"22", "22:2022"}, []Forward{{Host: Range{22, 22}, Guest: 2022}}},
		{[]string{"192.0.2.1/22", "%lo/80"}, []Forward{
			{Addr: a("192.0.2.1"), Host: Range{22, 22}, Guest: 22},
			{Iface: "lo", Host: Range{80, 80}, Guest: 80},
		}},
		{[]string{"all"}, []Forward{{Host: Range{1, 32767}, Guest: 1}, {Host: Range{61000, 65535}, Guest: 61000}}},
		{[]string{"~1000-2000"}, []Forward{{Host: Range{1, 999}, Guest: 1}, {Host: Range{2001, 32767}, Guest: 2001}, {Host: Range{61000, 65535}, Guest: 61000}}},
		// libvirt's <portForward address=… dev=…> without ranges (newer passt).
		{[]string{"127.0.0.1%lo/all"}, []Forward{
			{Addr: a("127.0.0.1"), Iface: "lo", Host: Range{1, 32767}, Guest: 1},
			{Addr: a("127.0.0.1"), Iface: "lo", Host: Range{61000, 65535}, Guest: 61000},
		}},
		{[]string{"22", "%lo/all"}, []Forward{
			{Host: Range{22, 22}, Guest: 22},
			{Iface: "lo", Host: Range{1, 32767}, Guest: 1}, {Iface: "lo", Host: Range{61000, 65535}, Guest: 61000},
		}},
	}
	for _, tt := range tests {
		var s Set
		for _, arg := range tt.args {
			if err := s.Add(arg); err != nil {
				t.Fatalf("%q: %v", tt.args, err)
			}
		}
		got := s.Forwards(eph)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%q: Forwards = %v, want %v", tt.args, got, tt.want)
		}
	}
}

func TestForwardString(t *testing.T) {
	tests := []struct {
		f    Forward
		want string
	}{
		{Forward{Host: Range{22, 22}, Guest: 22}, "22"},
		{Forward{Host: Range{8000, 8010}, Guest: 9000}, "8000-8010:9000-9010"},
		{Forward{Addr: netip.MustParseAddr("::1"), Iface: "lo", Host: Range{22, 22}, Guest: 2222}, "[::1]%lo/22:2222"},
		{Forward{Addr: netip.MustParseAddr("192.0.2.1"), Host: Range{1, 2}, Guest: 1}, "192.0.2.1/1-2"},
	}
	for _, tt := range tests {
		if got := tt.f.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.f, got, tt.want)
		}
		// Every rendering parses back to the same forward.
		var s Set
		if err := s.Add(tt.want); err != nil {
			t.Errorf("%q does not parse back: %v", tt.want, err)
			continue
		}
		if got := s.Forwards(Range{60000, 60000}); len(got) != 1 || got[0] != tt.f {
			t.Errorf("%q parses back to %v", tt.want, got)
		}
	}
}

// FuzzParse checks that no argument panics or hangs the parser and that
// every accepted specification keeps its invariants and expands to
// forwards that render back into an equivalent specification.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"22", "22,80", "8000-8010", "2222:22", "22-80:32-90", "192.0.2.1/22",
		"[::1]/22", "%eth0/22", "192.0.2.1%eth0/22", "2000-5000,~3000-3010", "~20000-20010",
		"all", "none", "auto", "", "0", "65535", "~1-10,~5", "/", "%/", "[]/1", "1:2:3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, arg string) {
		sp, err := Parse(arg)
		if err != nil {
			return
		}
		for _, m := range sp.Ports {
			if m.Host.First == 0 || m.Host.Last < m.Host.First || m.Guest == 0 ||
				int(m.Guest)+m.Host.Len()-1 > 65535 {
				t.Fatalf("%q: bad mapping %+v", arg, m)
			}
		}
		for _, x := range sp.Exclude {
			if x.First == 0 || x.Last < x.First {
				t.Fatalf("%q: bad exclusion %+v", arg, x)
			}
		}
		if sp.Mode == ModeAll || sp.ExcludeOnly() {
			return // expansion covers ~60k ports: too slow per input
		}
		var s Set
		if err := s.Add(arg); err != nil {
			t.Fatalf("%q: Parse ok but Add: %v", arg, err)
		}
		for _, fw := range s.Forwards(DefaultEphemeral) {
			var back Set
			if err := back.Add(fw.String()); err != nil {
				t.Fatalf("%q: forward %q does not parse: %v", arg, fw.String(), err)
			}
			if got := back.Forwards(Range{1, 1}); len(got) != 1 || got[0] != fw {
				t.Fatalf("%q: forward %v round-trips to %v", arg, fw, got)
			}
		}
	})
}
