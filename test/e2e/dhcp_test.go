package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
)

// defaultGuestMTU is what vunet tells the guest unless configured (DESIGN.md).
const defaultGuestMTU = 65520

// TestQEMUGuestDHCP lets the guest configure itself with busybox udhcpc and
// checks it received the host's own address, prefix and gateway (vunet's
// defaults, like passt), the default MTU and a DNS server, then resolves the
// gateway by ARP from the leased address.
func TestQEMUGuestDHCP(t *testing.T) {
	NeedQEMU(t)
	host, err := HostDefaults()
	if err != nil {
		Unavailable(t, err, "a host with an IPv4 default route")
	}
	d := StartDaemon(t, DaemonConfig{})
	vm := StartVM(t, VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckARP},
	})
	lease := vm.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	if got := lease.Fields["ip"]; got != host.Addr.String() {
		t.Errorf("leased address %s, want the host's %s", got, host.Addr)
	}
	if got := lease.Fields["mask"]; got != strconv.Itoa(host.Prefix) {
		t.Errorf("leased prefix /%s, want the host's /%d", got, host.Prefix)
	}
	if got := strings.Fields(lease.Fields["router"]); len(got) == 0 || got[0] != host.Gateway.String() {
		t.Errorf("leased router %q, want the host's gateway %s", lease.Fields["router"], host.Gateway)
	}
	if lease.Fields["dns"] == "" {
		t.Errorf("no DNS server in the lease")
	}
	if !d.Passt {
		if got := lease.Fields["mtu"]; got != strconv.Itoa(defaultGuestMTU) {
			t.Errorf("leased MTU %q, want %d", got, defaultGuestMTU)
		}
		if got := lease.Fields["if_mtu"]; got != strconv.Itoa(defaultGuestMTU) {
			t.Errorf("guest eth0 MTU %q after the lease, want %d", got, defaultGuestMTU)
		}
	}
	arp := vm.RequireResult(t, guest.CheckARP, 30*time.Second)
	if arp.Fields["target"] != host.Gateway.String() || arp.Fields["from"] != host.Addr.String() {
		t.Errorf("ARP check resolved %s from %s, want the gateway %s from %s", arp.Fields["target"], arp.Fields["from"], host.Gateway, host.Addr)
	}
	vm.Finish(t)
}
