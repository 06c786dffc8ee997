package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"vunet/test/guest"
)

// checkIPv6 waits for SLAAC: the guest kernel configures eth0 on its own
// from the back-end's router advertisements, so the check only watches
// /proc until a global address and a default route show up.
func (a *agent) checkIPv6(ctx context.Context) guest.Result {
	if s, _ := sysNet(ifName, "operstate"); s != "up" {
		_ = setUp(ifName)
	}
	var addrs []string
	var prefix int
	var router string
	err := waitFor(ctx, "a global IPv6 address and a default route", func() bool {
		addrs, prefix = globalIPv6(ifName)
		router = defaultIPv6Router(ifName)
		return len(addrs) > 0 && router != ""
	})
	r := guest.Result{Fields: map[string]string{
		"addrs": strings.Join(addrs, " "), "prefixlen": strconv.Itoa(prefix), "router": router,
	}}
	if err != nil {
		r.Fields["detail"] = err.Error()
		return r
	}
	r.OK = true
	return r
}

func globalIPv6(iface string) ([]string, int) {
	f, err := os.Open("/proc/net/if_inet6")
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	return parseIfInet6(f, iface)
}

// parseIfInet6 reads /proc/net/if_inet6 lines: "addr ifindex plen scope
// flags name"; it returns iface's usable global addresses.
func parseIfInet6(r io.Reader, iface string) ([]string, int) {
	var out []string
	plen := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 6 || fl[5] != iface || fl[3] != "00" {
			continue
		}
		// Tentative (0x40) addresses are not usable yet.
		if flags, err := strconv.ParseUint(fl[4], 16, 8); err != nil || flags&0x40 != 0 {
			continue
		}
		if ip := hexIPv6(fl[0]); ip != nil {
			out = append(out, ip.String())
			p, _ := strconv.ParseUint(fl[2], 16, 8)
			plen = int(p)
		}
	}
	return out, plen
}

func defaultIPv6Router(iface string) string {
	f, err := os.Open("/proc/net/ipv6_route")
	if err != nil {
		return ""
	}
	defer f.Close()
	return parseIPv6Route(f, iface)
}

// parseIPv6Route reads /proc/net/ipv6_route lines: "dst dstlen src srclen
// nexthop metric refcnt use flags name"; it returns iface's default router.
func parseIPv6Route(r io.Reader, iface string) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 10 || fl[9] != iface || fl[1] != "00" || fl[0] != strings.Repeat("0", 32) {
			continue
		}
		if ip := hexIPv6(fl[4]); ip != nil && !ip.IsUnspecified() {
			return ip.String()
		}
	}
	return ""
}

func hexIPv6(s string) net.IP {
	if len(s) != 32 {
		return nil
	}
	ip := make(net.IP, 16)
	for i := 0; i < 16; i++ {
		v, err := strconv.ParseUint(s[2*i:2*i+2], 16, 8)
		if err != nil {
			return nil
		}
		ip[i] = byte(v)
	}
	return ip
}
