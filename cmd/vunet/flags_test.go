package main

import (
	"bytes"
	"flag"
	"net/netip"
	"strings"
	"testing"
	"time"

	"vunet/cmd/vunet/portspec"
)

func TestParseFlags(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(*testing.T, *options)
	}{
		{name: "long socket", args: []string{"--socket", "/tmp/a.sock"}, check: func(t *testing.T, o *options) {
			if o.socket != "/tmp/a.sock" || o.socketMode != 0o600 || o.queues != 1 || o.oneOff || o.mtu != -1 || o.prefix4 != -1 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "equals form", args: []string{"--socket=/tmp/a.sock", "--queues=2"}, check: func(t *testing.T, o *options) {
			if o.socket != "/tmp/a.sock" || o.queues != 2 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "passt spellings", args: []string{"--vhost-user", "-s", "/tmp/b.sock", "-1", "-d", "-f", "-P", "/tmp/p", "-l", "/tmp/l", "-p", "/tmp/c.pcap"}, check: func(t *testing.T, o *options) {
			if o.socket != "/tmp/b.sock" || !o.oneOff || o.logLevel != "debug" || !o.foreground || !o.vhostUser || o.pidFile != "/tmp/p" || o.logFile != "/tmp/l" || o.pcap != "/tmp/c.pcap" {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "passt long spellings", args: []string{"--socket-path", "/tmp/b.sock", "--one-off", "--foreground", "--pid", "/tmp/p", "--log-file", "/tmp/l", "--quiet", "--pcap", "/x"}, check: func(t *testing.T, o *options) {
			if o.socket != "/tmp/b.sock" || !o.oneOff || !o.foreground || o.logLevel != "warn" || o.pcap != "/x" {
				t.Errorf("got %+v", o)
			}
		}},
		// A value starting with '-' is still the value of the flag before it.
		{name: "dash value", args: []string{"-s", "x", "-t", "-80"}, wantErr: `-t "-80"`},
		{name: "getopt forms", args: []string{"-1fds/tmp/c.sock", "-t22", "-u", "~53", "-a10.0.0.2", "-D", "1.1.1.1", "-46"}, check: func(t *testing.T, o *options) {
			if !o.oneOff || !o.foreground || o.logLevel != "debug" || o.socket != "/tmp/c.sock" || o.only4 || !o.only6 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "getopt forms valid", args: []string{"-1fd", "-s/tmp/c.sock", "-t22", "-t", "~1-1023", "-a10.0.0.2", "-4", "-m1500"}, check: func(t *testing.T, o *options) {
			if !o.oneOff || !o.foreground || o.logLevel != "debug" || o.socket != "/tmp/c.sock" || len(o.tcpPorts.Specs) != 2 ||
				o.addr4 != a("10.0.0.2") || !o.only4 || o.mtu != 1500 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "cluster ending in value flag", args: []string{"-1s", "/tmp/d.sock"}, check: func(t *testing.T, o *options) {
			if !o.oneOff || o.socket != "/tmp/d.sock" {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "unknown letter in cluster", args: []string{"-s", "x", "-1z"}, wantErr: "unknown flag --1z"},
		{name: "socket mode", args: []string{"--socket", "x", "--socket-mode", "0660"}, check: func(t *testing.T, o *options) {
			if o.socketMode != 0o660 {
				t.Errorf("mode %o", o.socketMode)
			}
		}},
		{name: "connect queues", args: []string{"--connect", "/run/q.sock", "--queues", "4"}, check: func(t *testing.T, o *options) {
			if o.connect != "/run/q.sock" || o.queues != 4 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "fd implies one-off", args: []string{"-F", "3"}, check: func(t *testing.T, o *options) {
			if o.fd != 3 || !o.oneOff {
				t.Errorf("fd %d one-off %v", o.fd, o.oneOff)
			}
		}},
		{name: "addressing, both families", args: []string{"-s", "x", "-a", "10.0.2.15", "-a", "2001:db8::15", "-n", "255.255.255.0",
			"-g", "10.0.2.2", "-g", "fe80::2", "-M", "02:00:00:00:00:01", "-m", "1500", "-i", "eth0", "-o", "192.0.2.9", "-o", "2001:db8::9"}, check: func(t *testing.T, o *options) {
			if o.addr4 != a("10.0.2.15") || o.addr6 != a("2001:db8::15") || o.prefix4 != 24 || o.gw4 != a("10.0.2.2") || o.gw6 != a("fe80::2") ||
				o.ourMAC.mac.String() != "02:00:00:00:00:01" || o.mtu != 1500 || o.iface != "eth0" || o.outbound4 != a("192.0.2.9") || o.outbound6 != a("2001:db8::9") {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "netmask as bits", args: []string{"-s", "x", "-n", "16"}, check: func(t *testing.T, o *options) {
			if o.prefix4 != 16 {
				t.Errorf("prefix %d", o.prefix4)
			}
		}},
		{name: "repeated dns and search", args: []string{"-s", "x", "-D", "1.1.1.1", "--dns", "2606:4700::1111", "-D", "9.9.9.9", "-S", "a.example", "--search", "b.example c.example"}, check: func(t *testing.T, o *options) {
			if len(o.dns) != 3 || o.dns[0] != a("1.1.1.1") || o.dns[1] != a("2606:4700::1111") || o.dns[2] != a("9.9.9.9") {
				t.Errorf("dns %v", o.dns)
			}
			if strings.Join(o.search, ",") != "a.example,b.example,c.example" {
				t.Errorf("search %q", o.search)
			}
		}},
		{name: "dns none", args: []string{"-s", "x", "-D", "none", "-S", "none"}, check: func(t *testing.T, o *options) {
			if !o.dnsNone || !o.searchNone {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "repeated port specs", args: []string{"-s", "x", "-t", "22", "-t", "8000-8010:9000-9010", "--tcp-ports", "~8005", "-u", "53", "-u", "5353"}, check: func(t *testing.T, o *options) {
			if o.tcpPorts.Mode != portspec.ModePorts || len(o.tcpPorts.Specs) != 3 || len(o.udpPorts.Specs) != 2 {
				t.Errorf("tcp %+v udp %+v", o.tcpPorts, o.udpPorts)
			}
		}},
		{name: "switches", args: []string{"-s", "x", "-4", "--no-dhcp", "--no-dhcpv6", "--no-ndp", "--no-ra", "--no-icmp", "--no-udp", "--no-map-gw", "--hostname", "g", "--fqdn", "g.example", "--runas", "nobody"}, check: func(t *testing.T, o *options) {
			if !o.only4 || !o.noDHCP || !o.noDHCPv6 || !o.noNDP || !o.noRA || !o.noICMP || !o.noUDP || !o.noMapGW || o.hostname != "g" || o.fqdn != "g.example" || o.runAs != "nobody" {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "no-tcp without forwards", args: []string{"-s", "x", "--no-tcp", "-t", "none"}, check: func(t *testing.T, o *options) {
			if !o.noTCP {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "map host loopback none", args: []string{"-s", "x", "--map-host-loopback", "none"}, check: func(t *testing.T, o *options) {
			if !o.mapHostLoopbackNone {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "limits", args: []string{"-s", "x", "--max-flows", "10", "--max-tcp-flows", "20", "--udp-timeout", "5s", "--icmp-timeout", "1s", "--tcp-idle-timeout", "1m", "--tcp-sndbuf", "65536", "--tcp-rcvbuf", "131072"}, check: func(t *testing.T, o *options) {
			if o.maxFlows != 10 || o.maxTCPFlows != 20 || o.udpTimeout != 5*time.Second || o.icmpTimeout != time.Second || o.tcpIdleTimeout != time.Minute || o.tcpSndBuf != 65536 || o.tcpRcvBuf != 131072 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "observability", args: []string{"-s", "x", "--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "warn"}, check: func(t *testing.T, o *options) {
			if o.metrics != "127.0.0.1:0" || o.logFormat != "json" || o.logLevel != "warn" {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "version needs no socket", args: []string{"--version"}},
		{name: "capabilities need no socket", args: []string{"--print-capabilities"}},

		{name: "no socket", args: nil, wantErr: "is required"},
		{name: "one-off with connect", args: []string{"--connect", "b", "-1"}, wantErr: "--one-off and --connect"},
		{name: "bad mode", args: []string{"-s", "a", "--socket-mode", "999"}, wantErr: "octal"},
		{name: "zero queues", args: []string{"-s", "a", "--queues", "0"}, wantErr: "--queues 0"},
		{name: "unknown flag", args: []string{"-s", "a", "--bogus"}, wantErr: "unknown flag --bogus"},
		{name: "unknown short flag", args: []string{"-s", "a", "-Z"}, wantErr: "unknown flag -Z"},
		{name: "missing argument", args: []string{"-s"}, wantErr: "flag -s needs an argument"},
		{name: "stray argument", args: []string{"-s", "a", "extra"}, wantErr: `"extra"`},
		{name: "bad log format", args: []string{"-s", "a", "--log-format", "xml"}, wantErr: "--log-format"},
		{name: "bad log level", args: []string{"-s", "a", "--log-level", "loud"}, wantErr: "--log-level"},
		{name: "no-tcp with -t", args: []string{"-s", "a", "--no-tcp", "-t", "22"}, wantErr: "--no-tcp"},
		{name: "-t before no-tcp", args: []string{"-s", "a", "-t", "all", "--no-tcp"}, wantErr: "--no-tcp"},
		{name: "no-udp with -u", args: []string{"-s", "a", "--no-udp", "-u", "53"}, wantErr: "--no-udp"},
		{name: "bad port spec", args: []string{"-s", "a", "-t", "80-22"}, wantErr: `-t "80-22"`},
		{name: "port mode conflict", args: []string{"-s", "a", "-t", "all", "-t", "22"}, wantErr: "conflicts"},
		{name: "loopback address", args: []string{"-s", "a", "-a", "127.0.0.1"}, wantErr: "loopback"},
		{name: "multicast gateway", args: []string{"-s", "a", "-g", "224.0.0.1"}, wantErr: "multicast"},
		{name: "bad address", args: []string{"-s", "a", "-a", "10.0.0"}, wantErr: "not an IP address"},
		{name: "bad netmask", args: []string{"-s", "a", "-n", "255.0.255.0"}, wantErr: "-n"},
		{name: "bad mac", args: []string{"-s", "a", "-M", "01:00:5e:00:00:01"}, wantErr: "unicast"},
		{name: "mtu low", args: []string{"-s", "a", "-m", "67"}, wantErr: "--mtu 67"},
		{name: "mtu high", args: []string{"-s", "a", "--mtu", "65536"}, wantErr: "--mtu 65536"},
		{name: "bad search domain", args: []string{"-s", "a", "-S", "bad..domain"}, wantErr: "label"},
		{name: "map loopback garbage", args: []string{"-s", "a", "--map-host-loopback", "gw"}, wantErr: "--map-host-loopback"},
		{name: "negative limit", args: []string{"-s", "a", "--max-flows", "-1"}, wantErr: "--max-flows"},
		{name: "bad duration", args: []string{"-s", "a", "--udp-timeout", "soon"}, wantErr: "--udp-timeout"},
		{name: "bad bool", args: []string{"-s", "a", "--no-dhcp=maybe"}, wantErr: "--no-dhcp"},
		{name: "long interface", args: []string{"-s", "a", "-i", "abcdefghijklmnopq"}, wantErr: "--interface"},
		{name: "negative fd", args: []string{"-F", "-2"}, wantErr: `-F "-2"`},
		{name: "fd on stdout", args: []string{"--fd", "1"}, wantErr: `--fd "1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, &bytes.Buffer{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("err %q is more than one line", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, o)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--print-capabilities"}, &out, &errb); code != 0 || out.String() != "{\"type\": \"net\"}\n" {
		t.Fatalf("print-capabilities: code %d out %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--version"}, &out, &errb); code != 0 || out.String() != versionLine(buildInfo())+"\n" {
		t.Fatalf("version: code %d out %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--bogus-flag"}, &out, &errb); code != 1 || errb.String() != "vunet: unknown flag --bogus-flag\n" {
		t.Fatalf("bad flag: code %d stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"--connect", "x", "--one-off"}, &out, &errb); code != 1 || strings.Count(errb.String(), "\n") != 1 {
		t.Fatalf("conflict: code %d stderr %q", code, errb.String())
	}
	errb.Reset()
	out.Reset()
	if code := run([]string{"--help"}, &out, &errb); code != 0 || errb.Len() != 0 {
		t.Fatalf("help: code %d stderr %q", code, errb.String())
	}
	help := out.String()
	for _, want := range []string{"Socket:", "Guest addressing:", "Forwarding:", "Limits:", "Observability:", "Information:",
		"--socket, --socket-path, -s PATH", "--tcp-ports, -t SPEC", "--address, -a ADDR", "--print-capabilities", "--metrics ADDR"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	// Groups come in the documented order.
	last := -1
	for _, g := range groups {
		i := strings.Index(help, "\n"+g+":\n")
		if i < last {
			t.Errorf("group %q out of order", g)
		}
		last = i
	}
}

// TestHelpListsEveryFlag keeps --help honest: every registered spelling
// is shown under some group.
func TestHelpListsEveryFlag(t *testing.T) {
	o := newOptions()
	fs, _ := o.flagSet()
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); err != errHelp {
		t.Fatalf("-h: %v", err)
	}
	help := out.String()
	fs.VisitAll(func(f *flag.Flag) {
		d := dashed(f.Name)
		if !strings.Contains(help, " "+d+" ") && !strings.Contains(help, " "+d+",") && !strings.Contains(help, " "+d+"\n") {
			t.Errorf("help lacks %s", dashed(f.Name))
		}
	})
}
