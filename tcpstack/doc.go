// Package tcpstack is vunet's translation core: it turns the guest's Ethernet
// frames into operations on native host sockets and host socket data back into
// frames, without a TCP/IP stack of its own (the host kernel keeps doing
// congestion control, retransmission and buffering, as with passt).
//
// Each virtio-net queue pair is served by one event loop on its own locked OS
// thread. The loop waits in epoll on the TX and RX kick eventfds, a wake
// eventfd for requests from the control goroutine, one timerfd and the flows'
// sockets; it moves guest frames through the TX path (pop a batch, copy the
// headers out of guest memory before parsing, dispatch, return the batch with
// one used-ring update) and writes frames for the guest through the RX path
// (reserve guest buffers first, write straight into them, publish in one batch,
// rewind unused reservations). The hot path takes no locks, uses no channels
// and does not allocate.
//
// What the loop translates: ARP, DHCP, DHCPv6 and NDP are answered by link
// services (svc_*.go) from [AddrConfig]; UDP flows become connected host UDP
// sockets, ICMP echo becomes ping sockets (udp_flow.go, icmp_echo.go, with
// the flow table in flow_table.go; fragmented UDP and ICMP datagrams are
// reassembled first, ip_reassembly.go); TCP segments go to the TCP table
// (tcp_*.go), which writes its frames through the same RX reservations.
// Before a guest flow opens a host socket (a TCP connection, a UDP or ICMP
// echo flow) the address policy of package addrpolicy decides whether it
// may and which host address it uses (the gateway mapping, the DNS
// forward); refusals are counted in stats.Queue.PolicyDrops and logged at a
// rate limit (addr_policy.go).
// Forwarded host ports (passt's -t and -u, [Config.TCPForwards] and
// [Config.UDPForwards], opened by [Open]) bring host peers' connections and
// datagrams to the guest (tcp_inbound.go, udp_forward.go). Config.Capture
// sees every frame both ways (capture.go).
// Flows and connections belong to the queue pair, not to one loop: they
// survive the control plane's stop/start cycles and re-register their
// sockets with each new loop.
//
// [Stack] implements the vhost-user back-end's data-plane interface
// structurally. The package imports only virtqueue, tcpstack/header and
// tcpstack/addrpolicy of vunet's packages: it must not import vhostuser,
// metrics or cmd, so the control plane and the exporters stay replaceable
// around it.
package tcpstack
