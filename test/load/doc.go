// Package load makes traffic for the system tests and the soak: floods of
// hand-made guest frames (SYNs, UDP, fragments, ARP, NDP, DHCP) written
// into the guest's interface from its network namespace (Flooder), and
// long-lived TCP streams checked byte for byte at the receiving end
// (Stream). It knows nothing of the rig: callers pass functions that run
// code in the guest's namespace or make its connections.
//
// It may import vunet's wire formats (tcpstack/header); nothing of vunet's
// may import it.
package load
