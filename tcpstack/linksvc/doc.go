// Package linksvc is the guest link's own services: the answers vunet gives
// as the guest's only neighbour, which no host socket is involved in —
// ARP (every address on the link but the guest's is ours), a DHCPv4 and a
// DHCPv6 server for the one guest, NDP (neighbor advertisements, router
// advertisements with the guest's prefix) — and the configuration they
// answer from (AddrConfig), by default the host's own addresses, routes and
// resolvers (DetectHostDefaults), as passt does.
//
// The services answer a frame the data path has parsed once
// (header.ParseFrame), write the reply into a buffer the caller owns, and
// say what they built (Reply) so that nobody parses it again to count it.
// They keep no state, take no locks and do not allocate. The package
// imports only tcpstack/header of vunet's.
package linksvc
