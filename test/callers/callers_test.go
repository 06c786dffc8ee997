package callers

import (
	"strings"
	"testing"
)

// The builders are checked against command lines written out by hand from
// the C sources, so a change to a builder must be a deliberate one.

var net0 = LibvirtNet{
	VhostUser: true, Socket: "/run/libvirt/qemu/passt/1-vm-net0.socket", PIDFile: "/run/libvirt/qemu/passt/1-vm-net0-passt.pid",
	MAC: "52:54:00:aa:bb:cc", MTU: 1500, SourceDev: "eth0", LogFile: "/var/log/p.log", Hostname: "vm", FQDN: "vm.example",
	IPs: []LibvirtIP{{Address: "10.0.0.5", Prefix: 24}, {Address: "fd00::5", Prefix: 64}},
	PortForwards: []LibvirtPortForward{
		{Proto: "tcp", Ranges: []LibvirtRange{{Start: 2222, To: 22}, {Start: 8000, End: 8010, To: 9000}, {Start: 8005, Exclude: true}}},
		{Proto: "udp", Dev: "eth0", Ranges: []LibvirtRange{{Start: 53}}},
		{Proto: "tcp", Address: "::1"},
	},
}

func TestLibvirt(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  []string
		want string
	}{
		{"9.0.0", Libvirt90(net0), "passt --one-off --socket /run/libvirt/qemu/passt/1-vm-net0.socket --mac-addr 52:54:00:aa:bb:cc " +
			"--mtu 1500 --interface eth0 --log-file /var/log/p.log --address 10.0.0.5 --netmask 24 --address fd00::5 " +
			"--tcp-ports 2222:22,8000-8010:9000-9010,~8005 --udp-ports 53 --tcp-ports ::1/all"},
		{"11.3.0", Libvirt113(net0), "passt --vhost-user --one-off --socket /run/libvirt/qemu/passt/1-vm-net0.socket --pid /run/libvirt/qemu/passt/1-vm-net0-passt.pid " +
			"--mtu 1500 --interface eth0 --log-file /var/log/p.log --address 10.0.0.5 --netmask 24 --address fd00::5 " +
			"--tcp-ports 2222:22,8000-8010:9000-9010,~8005 --udp-ports %eth0/53 --tcp-ports ::1/all"},
		{"master", LibvirtMaster(net0), "passt --vhost-user --one-off --socket /run/libvirt/qemu/passt/1-vm-net0.socket --pid /run/libvirt/qemu/passt/1-vm-net0-passt.pid " +
			"--mtu 1500 --interface eth0 --log-file /var/log/p.log --hostname vm --fqdn vm.example --address 10.0.0.5 --netmask 24 --address fd00::5 " +
			"--tcp-ports 2222:22,8000-8010:9000-9010,~8005 --udp-ports %eth0/53 --tcp-ports ::1/all"},
	} {
		if got := strings.Join(tc.got, " "); got != tc.want {
			t.Errorf("libvirt %s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
	if got, want := Libvirt90Netdev(net0, "hostnet0"), `{"type":"stream","addr":{"type":"unix","path":"/run/libvirt/qemu/passt/1-vm-net0.socket"},"server":false,"id":"hostnet0"}`; got != want {
		t.Errorf("libvirt 9.0.0 -netdev:\n got %s\nwant %s", got, want)
	}
	user := net0
	user.VhostUser = false
	if got := Libvirt113(user); got[1] != "--one-off" {
		t.Errorf("type='user' command line starts %q", got[:2])
	}
}

func TestQEMU101(t *testing.T) {
	if got, want := strings.Join(QEMU101(QEMUPasst{}, "/tmp/p.pid"), " "), "passt --quiet --pid /tmp/p.pid --fd 3"; got != want {
		t.Errorf("defaults:\n got %s\nwant %s", got, want)
	}
	p := QEMUPasst{
		Path: "/usr/bin/passt", Quiet: Bool(false), VhostUser: true, MTU: 9000, Address: "10.0.2.15", Netmask: "24",
		MAC: "9a:55:9a:55:9a:56", Gateway: "10.0.2.2", Interface: "eth0", Outbound: "10.0.0.1", OutboundIf4: "eth1",
		OutboundIf6: "eth2", DNS: "10.0.2.3", FQDN: "g.example", DHCPDNS: Bool(false), DHCPSearch: Bool(true),
		MapHostLoopback: "10.0.2.2", MapGuestAddr: "10.0.2.4", DNSForward: "10.0.2.3", DNSHost: "1.1.1.1",
		TCP: Bool(false), UDP: Bool(true), ICMP: Bool(false), DHCP: Bool(false), NDP: Bool(false), DHCPv6: Bool(false),
		RA: Bool(false), Freebind: Bool(true), IPv4: Bool(false), IPv6: Bool(false), Search: []string{"a.example", "b.example"},
		TCPPorts: []string{"22", "80:8080"}, UDPPorts: []string{"53"}, Param: []string{"--trace", "-e"},
	}
	want := "/usr/bin/passt --vhost-user --mtu 9000 --address 10.0.2.15 --netmask 24 --mac-addr 9a:55:9a:55:9a:56 " +
		"--gateway 10.0.2.2 --interface eth0 --outbound 10.0.0.1 --outbound-if4 eth1 --outbound-if6 eth2 --dns 10.0.2.3 " +
		"--fqdn g.example --no-dhcp-dns --map-host-loopback 10.0.2.2 --map-guest-addr 10.0.2.4 --dns-forward 10.0.2.3 " +
		"--dns-host 1.1.1.1 --no-tcp --no-icmp --no-dhcp --no-ndp --no-dhcpv6 --no-ra --freebind --ipv6-only --ipv4-only " +
		"--search a.example b.example --tcp-ports 22,80:8080 --udp-ports 53 --trace -e --pid /tmp/p.pid --fd 3"
	if got := strings.Join(QEMU101(p, "/tmp/p.pid"), " "); got != want {
		t.Errorf("every property:\n got %s\nwant %s", got, want)
	}
}
