package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"vunet/test/guest"
)

// DHCPv6 message types, option codes and ports used by the client
// (RFC 8415).
const (
	dhcp6Solicit     = 1
	dhcp6Reply       = 7
	dhcp6OptClientID = 1
	dhcp6OptServerID = 2
	dhcp6OptIANA     = 3
	dhcp6OptIAAddr   = 5
	dhcp6OptORO      = 6
	dhcp6OptElapsed  = 8
	dhcp6OptStatus   = 13
	dhcp6OptRapid    = 14
	dhcp6OptDNS      = 23
	dhcp6OptDomains  = 24
	dhcp6ClientPort  = 546
	dhcp6ServerPort  = 547
)

// checkDHCPv6 asks for an address with a Rapid Commit SOLICIT (busybox has
// no DHCPv6 client) and reports what the server's REPLY assigned: addr,
// dns, server. The address is reported, not configured: SLAAC already
// configured the interface.
func (a *agent) checkDHCPv6(ctx context.Context) guest.Result {
	ifi, err := net.InterfaceByName(ifName)
	if err != nil {
		return fail("%v", err)
	}
	// The client port is bound on the link-local address, which exists
	// once DAD is over.
	var c *net.UDPConn
	if err := waitFor(ctx, "a bindable link-local address", func() bool {
		var err error
		c, err = net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6unspecified, Port: dhcp6ClientPort, Zone: ifName})
		return err == nil
	}); err != nil {
		return fail("%v", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()

	var xid [3]byte
	_, _ = rand.Read(xid[:])
	duid := append([]byte{0, 3, 0, 1}, ifi.HardwareAddr...) // DUID-LL, Ethernet
	msg := append([]byte{dhcp6Solicit}, xid[:]...)
	msg = dhcp6Option(msg, dhcp6OptClientID, duid)
	msg = dhcp6Option(msg, dhcp6OptIANA, []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}) // IAID 1, T1 = T2 = 0
	msg = dhcp6Option(msg, dhcp6OptRapid, nil)
	msg = dhcp6Option(msg, dhcp6OptElapsed, []byte{0, 0})
	msg = dhcp6Option(msg, dhcp6OptORO, []byte{0, dhcp6OptDNS, 0, dhcp6OptDomains})
	servers := &net.UDPAddr{IP: net.ParseIP("ff02::1:2"), Port: dhcp6ServerPort, Zone: ifName}

	buf := make([]byte, 2048)
	for try := 0; ctx.Err() == nil; try++ {
		if _, err := c.WriteToUDP(msg, servers); err != nil {
			return fail("send SOLICIT: %v", err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				break // timeout: solicit again
			}
			r, ok := parseDHCPv6Reply(buf[:n], xid)
			if !ok {
				continue
			}
			r.Fields["server"] = from.IP.String()
			r.Fields["tries"] = fmt.Sprint(try + 1)
			return r
		}
	}
	return fail("no DHCPv6 REPLY: %v", ctx.Err())
}

func dhcp6Option(b []byte, code uint16, data []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, code)
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

// dhcp6Options walks an option list; it stops at the first malformed one.
func dhcp6Options(b []byte, fn func(code uint16, data []byte)) error {
	for len(b) > 0 {
		if len(b) < 4 {
			return errors.New("truncated option header")
		}
		code, n := binary.BigEndian.Uint16(b), int(binary.BigEndian.Uint16(b[2:]))
		if len(b) < 4+n {
			return fmt.Errorf("option %d: %d bytes, %d left", code, n, len(b)-4)
		}
		fn(code, b[4:4+n])
		b = b[4+n:]
	}
	return nil
}

// parseDHCPv6Reply reads a REPLY to transaction xid: ok is false for
// anything else. The result is ok when an address was assigned.
func parseDHCPv6Reply(b []byte, xid [3]byte) (guest.Result, bool) {
	if len(b) < 4 || b[0] != dhcp6Reply || [3]byte(b[1:4]) != xid {
		return guest.Result{}, false
	}
	r := guest.Result{Fields: map[string]string{}}
	var addrs, dns, problems []string
	rapid := false
	err := dhcp6Options(b[4:], func(code uint16, data []byte) {
		switch code {
		case dhcp6OptRapid:
			rapid = true
		case dhcp6OptServerID:
			r.Fields["server_duid"] = fmt.Sprintf("%x", data)
		case dhcp6OptDNS:
			for ; len(data) >= 16; data = data[16:] {
				dns = append(dns, netip.AddrFrom16([16]byte(data)).String())
			}
		case dhcp6OptStatus:
			if len(data) >= 2 && binary.BigEndian.Uint16(data) != 0 {
				problems = append(problems, fmt.Sprintf("status %d %q", binary.BigEndian.Uint16(data), data[2:]))
			}
		case dhcp6OptIANA:
			if len(data) < 12 {
				problems = append(problems, "short IA_NA")
				return
			}
			if err := dhcp6Options(data[12:], func(code uint16, d []byte) {
				switch {
				case code == dhcp6OptIAAddr && len(d) >= 24:
					addrs = append(addrs, netip.AddrFrom16([16]byte(d)).String())
					r.Fields["valid_lifetime"] = fmt.Sprint(binary.BigEndian.Uint32(d[20:]))
				case code == dhcp6OptStatus && len(d) >= 2 && binary.BigEndian.Uint16(d) != 0:
					problems = append(problems, fmt.Sprintf("IA_NA status %d %q", binary.BigEndian.Uint16(d), d[2:]))
				}
			}); err != nil {
				problems = append(problems, "IA_NA: "+err.Error())
			}
		}
	})
	if err != nil {
		problems = append(problems, err.Error())
	}
	if !rapid {
		problems = append(problems, "REPLY without Rapid Commit")
	}
	r.Fields["addr"] = strings.Join(addrs, " ")
	r.Fields["dns"] = strings.Join(dns, " ")
	if len(problems) > 0 {
		r.Fields["detail"] = strings.Join(problems, "; ")
	}
	r.OK = len(addrs) > 0 && len(problems) == 0
	return r, true
}
