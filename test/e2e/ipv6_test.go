package e2e

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
)

// TestQEMUGuestIPv6 checks NDP: the guest kernel configures itself from
// vunet's router advertisements (SLAAC) with an address in the host's
// prefix and a default route via a link-local router, and the guest's own
// DAD and router solicitation cause no trouble.
func TestQEMUGuestIPv6(t *testing.T) {
	NeedQEMU(t)
	host, err := HostDefaults()
	if err == nil && host.Addr6 == nil {
		err = errors.New("the default route's interface has no global IPv6 address")
	}
	if err != nil {
		Unavailable(t, err, "a host with an IPv4 default route and a global IPv6 address on the same interface")
	}
	d := StartDaemon(t, DaemonConfig{})
	vm := StartVM(t, VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckIPv6},
		Params: map[string]string{guest.ParamTimeout: "20s"},
	})
	r := vm.RequireResult(t, guest.CheckIPv6, 60*time.Second)
	prefix := &net.IPNet{IP: host.Addr6.Mask(net.CIDRMask(host.Prefix6, 128)), Mask: net.CIDRMask(host.Prefix6, 128)}
	inPrefix := false
	for _, a := range strings.Fields(r.Fields["addrs"]) {
		if ip := net.ParseIP(a); ip != nil && prefix.Contains(ip) {
			inPrefix = true
		}
	}
	if !inPrefix {
		t.Errorf("guest IPv6 addresses %q: none in the host's prefix %s", r.Fields["addrs"], prefix)
	}
	if ip := net.ParseIP(r.Fields["router"]); ip == nil || !ip.IsLinkLocalUnicast() {
		t.Errorf("guest default IPv6 router %q, want a link-local address", r.Fields["router"])
	}
	vm.Finish(t)
}
