package qemu

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
)

// HostNet is the host's default-route configuration, which vunet hands to
// the guest by default (DESIGN.md, "Addresses").
type HostNet struct {
	Iface   string
	Addr    net.IP // first IPv4 address of Iface
	Prefix  int
	Gateway net.IP
	MTU     int
	// Addr6 and Prefix6 are the interface's first global IPv6 address and
	// its prefix length (nil when it has none).
	Addr6   net.IP
	Prefix6 int
}

// HostDefaults reads the IPv4 default route from /proc/net/route and the
// interface's address.
func HostDefaults() (HostNet, error) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return HostNet{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 8 || fl[1] != "00000000" || fl[7] != "00000000" {
			continue
		}
		gw, err := hex.DecodeString(fl[2])
		if err != nil || len(gw) != 4 {
			continue
		}
		// /proc/net/route prints the address as a host-order (little-endian) word.
		g := make(net.IP, 4)
		binary.BigEndian.PutUint32(g, binary.LittleEndian.Uint32(gw))
		h := HostNet{Iface: fl[0], Gateway: g}
		ifi, err := net.InterfaceByName(h.Iface)
		if err != nil {
			return HostNet{}, fmt.Errorf("default route interface %s: %w", h.Iface, err)
		}
		h.MTU = ifi.MTU
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			switch {
			case !ok:
			case n.IP.To4() != nil && h.Addr == nil:
				h.Addr = n.IP.To4()
				h.Prefix, _ = n.Mask.Size()
			case n.IP.To4() == nil && n.IP.IsGlobalUnicast() && h.Addr6 == nil:
				h.Addr6 = n.IP
				h.Prefix6, _ = n.Mask.Size()
			}
		}
		if h.Addr == nil {
			return HostNet{}, fmt.Errorf("default route interface %s has no IPv4 address", h.Iface)
		}
		return h, nil
	}
	return HostNet{}, fmt.Errorf("no IPv4 default route in /proc/net/route")
}
