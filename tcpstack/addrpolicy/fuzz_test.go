package addrpolicy

import (
	"net/netip"
	"testing"
)

// FuzzOutbound checks the policy's promises for arbitrary header bytes:
// whatever the guest writes as source and destination, an allowed flow's
// host address is of the header's family, unicast, never link-local, and
// loopback only through the gateway mapping or the DNS forward; with both
// off nothing reaches the host's loopback.
func FuzzOutbound(f *testing.F) {
	seed := func(src, dst string, port uint16, v6 bool) {
		s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
		f.Add(s[:], d[:], port, uint8(0), v6)
	}
	seed("::ffff:10.0.2.15", "::ffff:127.0.0.1", 80, false)
	seed("::ffff:10.0.2.15", "::ffff:10.0.2.2", 53, false)
	seed("2001:db8:1::15", "::ffff:127.9.9.9", 80, true)
	seed("2001:db8:1::15", "::127.0.0.1", 80, true)
	seed("fe80::2", "fe80::1", 53, true)
	seed("::ffff:127.0.0.1", "::ffff:10.0.2.2", 80, false)
	f.Fuzz(func(t *testing.T, srcB, dstB []byte, port uint16, protoB uint8, v6 bool) {
		if len(srcB) < 16 || len(dstB) < 16 {
			return
		}
		src, dst := addrOf(srcB, v6), addrOf(dstB, v6)
		proto := Proto(protoB % uint8(NumProtos))
		for _, mapGW := range []bool{true, false} {
			for _, dns := range []bool{true, false} {
				v := New(testConfig(mapGW, dns)).Outbound(proto, src, netip.AddrPortFrom(dst, port))
				if !v.Allowed() {
					if v.Host.IsValid() || v.Reason >= NumReasons {
						t.Fatalf("refused with host %v reason %d", v.Host, v.Reason)
					}
					continue
				}
				h := v.Host.Addr()
				gateway := dst == gw4 || dst == gw6LL || dst == gw6Glob
				switch {
				case h.Is4() != dst.Is4() || h.Is4In6():
					t.Fatalf("%v → %v: host %v of another family", src, dst, h)
				case h.IsMulticast() || h.IsUnspecified() || h == broadcast4 || h.IsLinkLocalUnicast() && h.Is6():
					t.Fatalf("%v → %v: host %v", src, dst, h)
				case h.IsLoopback() && !gateway:
					t.Fatalf("map=%v dns=%v %v → %v reaches host loopback %v", mapGW, dns, src, dst, h)
				case h.IsLoopback() && !mapGW && !(dns && port == 53 && proto != ICMP):
					t.Fatalf("mapping off: %v → %v reaches host loopback %v", src, dst, h)
				case h != dst && !gateway:
					t.Fatalf("%v → %v: rewritten to %v", src, dst, h)
				}
				own := src == guest4 || src.Is6() && !src.Is4In6() && (src.IsLinkLocalUnicast() || netip.MustParsePrefix("2001:db8:1::/64").Contains(src))
				if !own {
					t.Fatalf("source %v allowed", src)
				}
			}
		}
	})
}

func addrOf(b []byte, v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte(b[:16]))
	}
	return netip.AddrFrom4([4]byte(b[12:16]))
}
