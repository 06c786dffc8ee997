package tcpstack

import (
	"log/slog"
	"net/netip"
	"time"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/dgram"
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/tcp"
)

// Config configures a [Stack].
type Config struct {
	// Logger receives the data path's logs; nil means slog.Default().
	Logger *slog.Logger
	// Addr is what the guest is told about its link (addresses, gateway,
	// resolvers, MTU); the link services answer from it and the flows map
	// the gateway with it. A zero OurMAC means linksvc.DefaultOurMAC.
	Addr linksvc.AddrConfig
	// NoMapGateway disables the mapping of guest flows to the gateway
	// address onto the host's loopback (127.0.0.1, ::1): the guest then
	// reaches nothing on the host's loopback except through the DNS
	// forward (Addr.DNSForward4/6). See package addrpolicy.
	NoMapGateway bool
	// NoMapGateway4 and NoMapGateway6 disable the mapping for one family
	// only (passt's --no-map-gw with --map-host-loopback naming the other
	// family's gateway).
	NoMapGateway4, NoMapGateway6 bool
	// MaxFlows bounds the UDP and ICMP echo flows the guest opens on one
	// queue pair (default 1024); a datagram that needs a new flow beyond it
	// closes the least recently used one. The peers of forwarded UDP ports
	// have a quota of their own beside it, a quarter of MaxFlows, and push
	// out only each other (dgram.Config.MaxInboundFlows).
	MaxFlows int
	// UDPTimeout closes a UDP flow idle for that long (default 180s).
	UDPTimeout time.Duration
	// ICMPTimeout closes an ICMP echo flow idle for that long (default 60s).
	ICMPTimeout time.Duration
	// NoTCP, NoUDP and NoICMP drop the guest's TCP segments, UDP
	// datagrams (the DHCP and DHCPv6 services still answer) and ICMP echo
	// requests, counted as stats.DropProtocolDisabled (passt's --no-tcp,
	// --no-udp, --no-icmp).
	NoTCP, NoUDP, NoICMP bool
	// Outbound4 and Outbound6, when valid, are the source addresses host
	// sockets of guest flows bind to (passt's -o/--outbound); otherwise
	// the routing table picks one.
	Outbound4, Outbound6 netip.Addr
	// TCPForwards and UDPForwards are host ports forwarded to the guest
	// (passt's -t and -u); Open opens them, New ignores them. Replies
	// to a UDP forward leave from the same host port, through a socket
	// bound to it and connected to the peer (a flow), so the peer sees
	// the address it sent to.
	TCPForwards, UDPForwards []Forward
	// Capture, when set, gets a copy of every frame from and to the guest
	// (see guestring.FrameCapture); nil costs nothing.
	Capture guestring.FrameCapture
	// TCP configures TCP translation. Its OurMAC, MTU, gateways, token tag
	// and logger are filled in from the fields above.
	TCP tcp.Config
}

// tcpConfig derives pair index's TCP settings.
func (s *Stack) tcpConfig(index int) tcp.Config {
	c := s.cfg.TCP
	c.OurMAC = s.cfg.Addr.OurMAC
	c.MTU = s.cfg.Addr.EffectiveMTU()
	c.Source = hostsock.Source{V4: s.cfg.Outbound4, V6: s.cfg.Outbound6}
	c.Policy = s.policy
	if c.Logger == nil {
		c.Logger = s.log.With("pair", index)
	}
	return c
}

// dgramConfig derives pair index's datagram flow settings.
func (s *Stack) dgramConfig(index int) dgram.Config {
	a := &s.cfg.Addr
	return dgram.Config{
		MaxFlows:      s.cfg.MaxFlows,
		UDPTimeout:    s.cfg.UDPTimeout,
		ICMPTimeout:   s.cfg.ICMPTimeout,
		Policy:        s.policy,
		OurMAC:        a.OurMAC,
		GuestMAC:      s,
		Source:        hostsock.Source{V4: s.cfg.Outbound4, V6: s.cfg.Outbound6},
		Guest4:        a.IPv4.Addr,
		Guest6:        a.IPv6.Addr,
		NoHostSockets: s.noHostSockets,
		Logger:        s.log.With("pair", index),
	}
}

// newAddrPolicy builds the address policy (package addrpolicy) from the
// Stack's configuration: the guest's addresses and prefixes, its gateways,
// the gateway mapping and the DNS forward.
func newAddrPolicy(cfg *Config) *addrpolicy.Policy {
	a := &cfg.Addr
	pc := addrpolicy.Config{
		Gateway4:    a.IPv4.Gateway,
		MapGateway:  !cfg.NoMapGateway,
		Unmapped4:   cfg.NoMapGateway4,
		Unmapped6:   cfg.NoMapGateway6,
		DNSForward4: a.DNSForward4,
		DNSForward6: a.DNSForward6,
	}
	if !a.Disable4 && a.IPv4.Addr.IsValid() {
		pc.Guest4 = netip.PrefixFrom(a.IPv4.Addr, a.IPv4.PrefixLen)
	}
	if !a.Disable6 {
		pc.LinkLocal6 = true
		pc.Gateway6 = a.RouterLL()
		pc.Gateway6Global = a.IPv6.Gateway
		if a.IPv6.Addr.IsValid() {
			pc.Guest6 = netip.PrefixFrom(a.IPv6.Addr, a.IPv6.PrefixLen)
		}
	}
	return addrpolicy.New(pc)
}
