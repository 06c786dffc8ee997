package e2e

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// defaultGuestMTU is what vunet tells the guest unless configured (DESIGN.md).
const defaultGuestMTU = 65520

// lease is what a DHCP test expects the guest to be told.
type lease struct {
	addr, router, dns netip.Addr
	prefix, mtu       int
	search            string
}

// checkLease compares the dhcp result with want, field by field.
func checkLease(t *testing.T, r guest.Result, want lease) {
	t.Helper()
	for _, c := range []struct{ what, got, want string }{
		{"address", r.Fields["ip"], want.addr.String()},
		{"prefix", r.Fields["mask"], strconv.Itoa(want.prefix)},
		{"router", firstField(r.Fields["router"]), want.router.String()},
		{"DNS server", firstField(r.Fields["dns"]), want.dns.String()},
		{"MTU option", r.Fields["mtu"], strconv.Itoa(want.mtu)},
		{"eth0 MTU after the lease", r.Fields["if_mtu"], strconv.Itoa(want.mtu)},
	} {
		if c.got != c.want {
			t.Errorf("lease %s = %q, want %q (%s)", c.what, c.got, c.want, r.Format())
		}
	}
	if want.search != "" && !strings.Contains(r.Fields["search"]+" "+r.Fields["domain"], want.search) {
		t.Errorf("lease search list %q / domain %q, want %q", r.Fields["search"], r.Fields["domain"], want.search)
	}
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return ""
}

// TestQEMUGuestDHCP lets the guest configure itself with busybox udhcpc
// from a daemon started without addressing flags: the lease must carry the
// "host's" own address, prefix and gateway (the namespace's, NetNSHost),
// its resolver and search list, and the default MTU; then the gateway
// answers ARP for the leased address, and DHCPv6 assigns the host's IPv6
// address.
func TestQEMUGuestDHCP(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckARP, guest.CheckIPv6, guest.CheckDHCPv6},
	})
	h := ns.Host
	checkLease(t, vm.RequireResult(t, guest.CheckDHCP, 60*time.Second), lease{
		addr: addrOf(h.Addr), prefix: h.Prefix, router: addrOf(h.Gateway), dns: ns.DNS4,
		mtu: defaultGuestMTU, search: "e2e.test",
	})
	arp := vm.RequireResult(t, guest.CheckARP, 30*time.Second)
	if arp.Fields["target"] != h.Gateway.String() || arp.Fields["from"] != h.Addr.String() {
		t.Errorf("ARP check resolved %s from %s, want the gateway %s from %s", arp.Fields["target"], arp.Fields["from"], h.Gateway, h.Addr)
	}
	checkDHCPv6(t, vm, addrOf(h.Addr6))
	vm.Finish(t)
}

// checkDHCPv6 asserts the DHCPv6 server assigned want (after the ipv6
// check, which the caller runs before).
func checkDHCPv6(t *testing.T, vm *qemu.VM, want netip.Addr) {
	t.Helper()
	vm.RequireResult(t, guest.CheckIPv6, 60*time.Second)
	r := vm.RequireResult(t, guest.CheckDHCPv6, 30*time.Second)
	if r.Fields["addr"] != want.String() {
		t.Errorf("DHCPv6 assigned %q, want %s (%s)", r.Fields["addr"], want, r.Format())
	}
	if ip, err := netip.ParseAddr(r.Fields["server"]); err != nil || !ip.IsLinkLocalUnicast() {
		t.Errorf("DHCPv6 reply from %q, want the router's link-local address", r.Fields["server"])
	}
}

// TestQEMUGuestDHCPFlags configures the guest's addresses, gateway,
// resolver and MTU with passt's flags (-a -n -g -D -m, and -a/-g again for
// IPv6) and checks the guest got exactly those by DHCP, SLAAC and DHCPv6, then
// downloads from the host through the configured gateway and echoes UDP
// datagrams up to 65000 bytes, which the guest fragments at MTU 9000.
func TestQEMUGuestDHCPFlags(t *testing.T) {
	qemu.NeedQEMU(t)
	for _, f := range []string{"--address", "--netmask", "--gateway", "--dns", "--mtu"} {
		needFlag(t, f)
	}
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	want := lease{
		addr: netip.MustParseAddr("10.42.7.9"), prefix: 16, router: netip.MustParseAddr("10.42.0.1"),
		dns: netip.MustParseAddr("10.42.0.53"), mtu: 9000,
	}
	addr6, gw6 := netip.MustParseAddr("fd42::9"), netip.MustParseAddr("fd42::1")
	d := netDaemon(t, ns,
		"-a", want.addr.String(), "-n", strconv.Itoa(want.prefix), "-g", want.router.String(),
		"-D", want.dns.String(), "-m", strconv.Itoa(want.mtu),
		"-a", addr6.String(), "-g", gw6.String())
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckIPv6, guest.CheckDHCPv6, guest.XferCheck("down"), guest.CheckUDPEcho},
		Params: map[string]string{
			guest.XferParam("down"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), 10<<20),
			guest.ParamUDPEcho:      srv.Target(guest.TargetGW4),
		},
	})
	checkLease(t, vm.RequireResult(t, guest.CheckDHCP, 60*time.Second), want)
	r := vm.RequireResult(t, guest.CheckIPv6, 60*time.Second)
	prefix := netip.PrefixFrom(addr6, 64).Masked()
	ok := false
	for _, a := range strings.Fields(r.Fields["addrs"]) {
		if ip, err := netip.ParseAddr(a); err == nil && prefix.Contains(ip) {
			ok = true
		}
	}
	if !ok {
		t.Errorf("guest IPv6 addresses %q: none in the configured prefix %s", r.Fields["addrs"], prefix)
	}
	checkDHCPv6(t, vm, addr6)
	// TCP segments sized for the configured MTU, through the configured gateway.
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("down"), 60*time.Second), guest.XferDown, 10<<20)
	// With MTU 9000 the guest fragments the larger datagrams; the daemon
	// reassembles them before they go out whole.
	if r := vm.RequireResult(t, guest.CheckUDPEcho, 60*time.Second); r.Fields["echoed"] != strconv.Itoa(len(guest.UDPEchoSizes)) || r.Fields["mismatched"] != "0" {
		t.Errorf("udp echo at MTU %d: %s", want.mtu, r.Format())
	}
	vm.Finish(t)
}

func addrOf(ip []byte) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
