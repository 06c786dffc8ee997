// Command vunet-repair is the privileged helper that sets and clears
// TCP_REPAIR on TCP sockets for vunet, which never holds the capability
// (CAP_NET_ADMIN) that repair mode needs: with it, a migrated guest's TCP
// connections can be read out of their sockets and recreated elsewhere.
//
// Usage:
//
//	vunet-repair PATH
//
// It connects to the daemon's repair socket at PATH (vunet's
// --repair-path) and serves until the daemon closes the connection: each
// message is one signed byte, TCP_REPAIR_ON (1), TCP_REPAIR_OFF (0) or
// TCP_REPAIR_OFF_NO_WP (-1), with 1 to 253 sockets as SCM_RIGHTS; it sets
// TCP_REPAIR to that value on each and answers with the same byte. On any
// failure — a descriptor that is not a TCP socket, another value, a
// truncated message — it closes the connection and exits 1. This is
// passt-repair's protocol: either helper serves either daemon.
//
// It does nothing else: it opens nothing, touches only the sockets it is
// given, and only that one option. Grant it CAP_NET_ADMIN (setcap
// cap_net_admin+ep) rather than running it as root.
package main

import (
	"fmt"
	"net"
	"os"

	"vunet/tcpstack/hostsock"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: vunet-repair PATH\n\nSets TCP_REPAIR on the sockets the vunet daemon listening at PATH (--repair-path) sends.")
		os.Exit(2)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Args[1], Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "vunet-repair:", err)
		os.Exit(1)
	}
	defer c.Close()
	if err := hostsock.ServeRepair(c); err != nil {
		fmt.Fprintln(os.Stderr, "vunet-repair:", err)
		os.Exit(1)
	}
}
