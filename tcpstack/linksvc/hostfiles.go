package linksvc

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"vunet/tcpstack/header"
)

// The host files host defaults are read from, parsed: /proc/net/route,
// /proc/net/ipv6_route, /proc/net/if_inet6 and /etc/resolv.conf.

func readWith[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("read host defaults: %w", err)
	}
	defer f.Close()
	v, err := parse(f)
	if err != nil {
		return v, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// defaultRoute is the chosen default route of one family.
type defaultRoute struct {
	ok      bool
	ifname  string
	gateway netip.Addr // invalid for a direct (device) route
	metric  uint32
}

// Route flags from linux/route.h.
const (
	rtfUp      = 0x0001
	rtfGateway = 0x0002
	rtfReject  = 0x0200
)

// parseProcRoute picks the lowest-metric usable IPv4 default route from
// /proc/net/route.
func parseProcRoute(r io.Reader) (defaultRoute, error) {
	var best defaultRoute
	sc := bufio.NewScanner(r)
	for line := 0; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if line == 0 || len(f) < 8 {
			continue // header
		}
		dst, err1 := strconv.ParseUint(f[1], 16, 32)
		gw, err2 := strconv.ParseUint(f[2], 16, 32)
		flags, err3 := strconv.ParseUint(f[3], 16, 32)
		metric, err4 := strconv.ParseUint(f[6], 10, 32)
		mask, err5 := strconv.ParseUint(f[7], 16, 32)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return best, fmt.Errorf("line %d: %w", line+1, err)
		}
		if dst != 0 || mask != 0 || flags&rtfUp == 0 || flags&rtfReject != 0 || f[0] == "lo" {
			continue
		}
		if best.ok && uint32(metric) >= best.metric {
			continue
		}
		rt := defaultRoute{ok: true, ifname: f[0], metric: uint32(metric)}
		if flags&rtfGateway != 0 && gw != 0 {
			// The kernel prints the network-order word as a host integer.
			var b [4]byte
			binary.NativeEndian.PutUint32(b[:], uint32(gw))
			rt.gateway = netip.AddrFrom4(b)
		}
		best = rt
	}
	return best, sc.Err()
}

// parseProcIPv6Route picks the lowest-metric usable IPv6 default route from
// /proc/net/ipv6_route.
func parseProcIPv6Route(r io.Reader) (defaultRoute, error) {
	var best defaultRoute
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		dst, err1 := parseHex16(f[0])
		dstLen, err2 := strconv.ParseUint(f[1], 16, 8)
		gw, err3 := parseHex16(f[4])
		metric, err4 := strconv.ParseUint(f[5], 16, 32)
		flags, err5 := strconv.ParseUint(f[8], 16, 32)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return best, fmt.Errorf("line %d: %w", line, err)
		}
		if dst != ([16]byte{}) || dstLen != 0 || flags&rtfUp == 0 || flags&rtfReject != 0 || f[9] == "lo" {
			continue
		}
		if best.ok && uint32(metric) >= best.metric {
			continue
		}
		rt := defaultRoute{ok: true, ifname: f[9], metric: uint32(metric)}
		if gw != ([16]byte{}) {
			rt.gateway = netip.AddrFrom16(gw)
		}
		best = rt
	}
	return best, sc.Err()
}

func parseHex16(s string) ([16]byte, error) {
	var a [16]byte
	if len(s) != 32 {
		return a, fmt.Errorf("address %q: want 32 hex digits", s)
	}
	_, err := hex.Decode(a[:], []byte(s))
	return a, err
}

// ifInet6Entry is one line of /proc/net/if_inet6.
type ifInet6Entry struct {
	prefix netip.Prefix
	scope  uint8
	flags  uint8
	ifname string
}

// Address flags from linux/if_addr.h.
const (
	ifaTemporary  = 0x01
	ifaDadFailed  = 0x08
	ifaDeprecated = 0x20
	ifaTentative  = 0x40
)

func parseIfInet6(r io.Reader) ([]ifInet6Entry, error) {
	var out []ifInet6Entry
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		a, err1 := parseHex16(f[0])
		plen, err2 := strconv.ParseUint(f[2], 16, 8)
		scope, err3 := strconv.ParseUint(f[3], 16, 8)
		flags, err4 := strconv.ParseUint(f[4], 16, 8)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return out, fmt.Errorf("line %d: %w", line, err)
		}
		if plen > 128 {
			return out, fmt.Errorf("line %d: prefix length %d", line, plen)
		}
		out = append(out, ifInet6Entry{prefix: netip.PrefixFrom(netip.AddrFrom16(a), int(plen)), scope: uint8(scope), flags: uint8(flags), ifname: f[5]})
	}
	return out, sc.Err()
}

// resolvConf is what we take from /etc/resolv.conf.
type resolvConf struct {
	servers []netip.Addr
	search  []string
}

// parseResolvConf reads nameserver, search and domain lines; the last of
// search/domain wins, as in glibc.
func parseResolvConf(r io.Reader) (resolvConf, error) {
	var rc resolvConf
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if a, err := netip.ParseAddr(f[1]); err == nil {
				rc.servers = append(rc.servers, a)
			}
		case "search":
			rc.search = nil
			for _, d := range f[1:] {
				if header.DomainNameEncodedLen(d) > 1 {
					rc.search = append(rc.search, strings.TrimSuffix(d, "."))
				}
			}
		case "domain":
			if header.DomainNameEncodedLen(f[1]) > 1 {
				rc.search = []string{strings.TrimSuffix(f[1], ".")}
			}
		}
	}
	return rc, sc.Err()
}
