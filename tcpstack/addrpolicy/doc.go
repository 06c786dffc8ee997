// Package addrpolicy decides, in one place, which guest traffic vunet may
// turn into host socket operations and which host address those sockets
// really use. TCP connections, UDP and ICMP echo flows and the inbound
// forwards all ask it; it has no state besides its configuration and
// imports nothing of vunet's.
//
// The policy (DESIGN.md "Address policy"):
//
//   - Addresses are normalised before anything is decided: an IPv4-mapped
//     IPv6 address (::ffff:a.b.c.d) or an IPv4-compatible one (::a.b.c.d) is
//     judged by the IPv4 address inside it, because that is what a host
//     socket would reach.
//   - A guest packet is refused when its destination is loopback
//     (127.0.0.0/8, ::1, and the mapped spellings of 127.0.0.0/8, as well
//     as its NAT64, 6to4 and Teredo spellings), unspecified (0.0.0.0/8,
//     ::, likewise), any other IPv4-mapped or -compatible IPv6
//     address (::ffff:0:0/96, ::/96), multicast, broadcast (255.255.255.255
//     or the directed broadcast of the guest's prefix) or an IPv6 link-local
//     address other than the gateway's (no host socket can reach the guest's
//     link). Multicast and broadcast that a service of ours answers (DHCP,
//     DHCPv6, NDP) never get here: the link services take them first.
//   - It is refused when its source is loopback, unspecified, multicast or
//     broadcast, or not the guest's own: the IPv4 address assigned to the
//     guest, an address in the IPv6 prefix it is given (SLAAC and privacy
//     addresses included) or, with IPv6 on, fe80::/10.
//   - Only two rules produce a loopback destination, and only from the
//     gateway address: the gateway mapping (Config.MapGateway: the gateway
//     is the host, reached on 127.0.0.1 or ::1; passt's
//     --map-host-loopback, on by default) and the DNS forward
//     (Config.DNSForward4/6: TCP and UDP to the gateway's port 53 go to the
//     host's resolver). With the mapping off and no DNS forward, nothing the
//     guest sends reaches the host's loopback, however it spells the address.
//   - Inbound forwards: a host peer on the loopback, or on the guest's own
//     address (the host's address, which the guest is given by default),
//     appears to the guest as the gateway, so the guest's replies stay
//     inside the forwarded connection.
//
// Refusals come with a [Reason] whose String is a stable metric label.
package addrpolicy
