package e2e

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// TestQEMUGuestIPv6 checks NDP and IPv6 TCP: the guest kernel configures
// itself from vunet's router advertisements (SLAAC) with an address in the
// "host's" prefix (NetNSHost) and a default route via a link-local router,
// and the guest's own DAD and router solicitation cause no trouble. Then
// UDP datagrams of 20 sizes are echoed through the router's link-local
// address, and 100 MB go down and up, byte-exact, to the host's ::1
// through the router's link-local address and through the host's global
// router address.
func TestQEMUGuestIPv6(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	params := map[string]string{guest.ParamTimeout: xferCheckTimeout, guest.ParamUDPEcho: srv.Target(guest.TargetGW6)}
	gw6 := qemu.NetNSGateway6.String()
	checks := append([]string{guest.CheckLink, guest.CheckIPv6, guest.CheckUDPEcho}, xferParams(params, srv,
		[2]string{"down6ll", guest.XferDown + "@" + guest.TargetGW6},
		[2]string{"up6ll", guest.XferUp + "@" + guest.TargetGW6},
		[2]string{"down6g", guest.XferDown + "@" + gw6},
		[2]string{"up6g", guest.XferUp + "@" + gw6},
	)...)
	vm := qemu.StartVM(t, qemu.VMConfig{Socket: d.Socket, Checks: checks, Params: params, Timeout: 6 * time.Minute})
	r := vm.RequireResult(t, guest.CheckIPv6, 60*time.Second)
	prefix := netip.PrefixFrom(netip.AddrFrom16([16]byte(ns.Host.Addr6.To16())), ns.Host.Prefix6).Masked()
	inPrefix := false
	for _, a := range strings.Fields(r.Fields["addrs"]) {
		if ip, err := netip.ParseAddr(a); err == nil && prefix.Contains(ip) {
			inPrefix = true
		}
	}
	if !inPrefix {
		t.Errorf("guest IPv6 addresses %q: none in the host's prefix %s", r.Fields["addrs"], prefix)
	}
	if ip := net.ParseIP(r.Fields["router"]); ip == nil || !ip.IsLinkLocalUnicast() {
		t.Errorf("guest default IPv6 router %q, want a link-local address", r.Fields["router"])
	}
	if u := vm.RequireResult(t, guest.CheckUDPEcho, 60*time.Second); u.Fields["echoed"] != strconv.Itoa(len(guest.UDPEchoSizes)) || u.Fields["mismatched"] != "0" {
		t.Errorf("udp echo over IPv6: %s", u.Format())
	}
	for _, x := range []struct{ label, dir string }{{"down6ll", guest.XferDown}, {"up6ll", guest.XferUp}, {"down6g", guest.XferDown}, {"up6g", guest.XferUp}} {
		res, err := vm.WaitResult(guest.XferCheck(x.label), 150*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("guest: %s", res.Format())
		if !res.OK {
			t.Errorf("transfer %s failed: %s", x.label, res.Format())
			continue
		}
		srv.CheckXfer(t, res, x.dir, xferSize)
	}
	vm.Finish(t)
	checkNoRingErrors(t, d)
}

// TestQEMUGuestSLAACWithoutRS configures a guest that sends no Router
// Solicitation (router_solicitations=0): it learns its prefix and default
// router from vunet's unsolicited advertisements alone. The one of the
// pair start reaches it when its driver opens the device, before Linux
// calls the link ready, and Linux drops the address it makes from that
// one; the initial advertisements that follow (tcpstack/replies.go) must
// configure it. Before them the next RA came 10 minutes later.
func TestQEMUGuestSLAACWithoutRS(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckIPv6},
		Params: map[string]string{guest.ParamSysctl: "net/ipv6/conf/eth0/router_solicitations=0"},
	})
	r := vm.RequireResult(t, guest.CheckIPv6, 60*time.Second)
	prefix := netip.PrefixFrom(netip.AddrFrom16([16]byte(ns.Host.Addr6.To16())), ns.Host.Prefix6).Masked()
	inPrefix := false
	for _, a := range strings.Fields(r.Fields["addrs"]) {
		if ip, err := netip.ParseAddr(a); err == nil && prefix.Contains(ip) {
			inPrefix = true
		}
	}
	if !inPrefix {
		t.Errorf("guest IPv6 addresses %q: none in the host's prefix %s", r.Fields["addrs"], prefix)
	}
	if ip := net.ParseIP(r.Fields["router"]); ip == nil || !ip.IsLinkLocalUnicast() {
		t.Errorf("guest default IPv6 router %q, want a link-local address", r.Fields["router"])
	}
	if d.Passt {
		vm.Finish(t)
		return
	}
	m, err := d.Scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The pair start's RA, which the guest dropped, and at least one more.
	if n := m.Sum("vunet_ndp_messages_sent_total", "type", "router_advert"); n < 2 {
		t.Errorf("%v router advertisements sent, want the pair start's and at least one initial one", n)
	}
	vm.Finish(t)
}
