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
		// What the interface has instead, to tell "no RA arrived" from
		// "the address went away" after the fact.
		r.Fields["if_inet6"] = procLines("/proc/net/if_inet6", ifName)
		r.Fields["ipv6_route"] = procLines("/proc/net/ipv6_route", ifName)
		r.Fields["ipv6_conf"] = ipv6Conf(ifName)
		return r
	}
	r.OK = true
	return r
}

// procLines returns the lines of a /proc table that end with iface's name,
// joined by " | ".
func procLines(path, iface string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[len(f)-1] == iface {
			out = append(out, strings.Join(f, " "))
		}
	}
	return strings.Join(out, " | ")
}

// ipv6Conf returns the IPv6 settings of iface that decide whether router
// advertisements configure it.
func ipv6Conf(iface string) string {
	var out []string
	for _, k := range []string{"disable_ipv6", "accept_ra", "autoconf", "accept_dad", "rtr_solicits"} {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + iface + "/" + k)
		if err != nil {
			continue
		}
		out = append(out, k+"="+strings.TrimSpace(string(b)))
	}
	return strings.Join(out, " ")
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
