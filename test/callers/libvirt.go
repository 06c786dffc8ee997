package callers

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// LibvirtNet is the part of a domain's <interface> that libvirt turns into
// passt's command line.
type LibvirtNet struct {
	// VhostUser: <interface type='vhostuser'> rather than type='user'
	// (libvirt ≥ 11.1.0).
	VhostUser bool
	// Socket and PIDFile are the paths libvirt derives from the domain
	// and interface alias under its passt state directory.
	Socket, PIDFile string
	// MAC is <mac address=…/>; libvirt 9.0.0 alone passes it (as passt's
	// --mac-addr, which passt takes for its own address).
	MAC string
	// MTU is <mtu size=…/>; 0 = none.
	MTU uint
	// SourceDev is <source dev=…/> (passt's --interface).
	SourceDev string
	// LogFile is <backend logFile=…/>.
	LogFile string
	// Hostname and FQDN are <backend hostname=… fqdn=…/> (libvirt master).
	Hostname, FQDN string
	// IPs are the <ip address=… prefix=…/> elements: at most one per
	// family, a prefix only for IPv4.
	IPs []LibvirtIP
	// PortForwards are the <portForward> elements.
	PortForwards []LibvirtPortForward
}

// LibvirtIP is one <ip>.
type LibvirtIP struct {
	Address string
	Prefix  uint // 0 = none
}

// LibvirtPortForward is one <portForward proto=… address=… dev=…>.
type LibvirtPortForward struct {
	Proto   string // "tcp" or "udp"
	Address string // optional
	Dev     string // optional
	Ranges  []LibvirtRange
}

// LibvirtRange is one <range start=… end=… to=… exclude=…/>.
type LibvirtRange struct {
	Start, End, To uint
	Exclude        bool
}

// Libvirt90 is libvirt 9.0.0's qemuPasstStart (Debian 12).
func Libvirt90(n LibvirtNet) []string {
	args := []string{"passt", "--one-off", "--socket", n.Socket, "--mac-addr", n.MAC}
	args = append(args, n.mtuIfaceLog()...)
	args = append(args, n.ips()...)
	return append(args, n.ports(true)...)
}

// Libvirt113 is libvirt 11.3.0's qemuPasstStart (Debian 13).
func Libvirt113(n LibvirtNet) []string {
	args := []string{"passt"}
	if n.VhostUser {
		args = append(args, "--vhost-user")
	}
	args = append(args, "--one-off", "--socket", n.Socket, "--pid", n.PIDFile)
	args = append(args, n.mtuIfaceLog()...)
	args = append(args, n.ips()...)
	return append(args, n.ports(false)...)
}

// LibvirtMaster is qemuPasstBuildCommand of libvirt master (2025): as
// 11.3.0, with --hostname and --fqdn after --log-file.
func LibvirtMaster(n LibvirtNet) []string {
	args := []string{"passt"}
	if n.VhostUser {
		args = append(args, "--vhost-user")
	}
	args = append(args, "--one-off", "--socket", n.Socket, "--pid", n.PIDFile)
	args = append(args, n.mtuIfaceLog()...)
	if n.Hostname != "" {
		args = append(args, "--hostname", n.Hostname)
	}
	if n.FQDN != "" {
		args = append(args, "--fqdn", n.FQDN)
	}
	args = append(args, n.ips()...)
	return append(args, n.ports(false)...)
}

func (n LibvirtNet) mtuIfaceLog() []string {
	var args []string
	if n.MTU != 0 {
		args = append(args, "--mtu", strconv.FormatUint(uint64(n.MTU), 10))
	}
	if n.SourceDev != "" {
		args = append(args, "--interface", n.SourceDev)
	}
	if n.LogFile != "" {
		args = append(args, "--log-file", n.LogFile)
	}
	return args
}

func (n LibvirtNet) ips() []string {
	var args []string
	for _, ip := range n.IPs {
		args = append(args, "--address", ip.Address)
		if ip.Prefix != 0 && !strings.Contains(ip.Address, ":") {
			args = append(args, "--netmask", strconv.FormatUint(uint64(ip.Prefix), 10))
		}
	}
	return args
}

// ports renders the <portForward> elements. libvirt 9.0.0 writes the
// %dev only after an address; later versions write it alone too.
func (n LibvirtNet) ports(v90 bool) []string {
	var args []string
	for _, pf := range n.PortForwards {
		args = append(args, "--"+pf.Proto+"-ports")
		var b strings.Builder
		if v90 {
			if pf.Address != "" {
				b.WriteString(pf.Address)
				if pf.Dev != "" {
					b.WriteString("%" + pf.Dev)
				}
				b.WriteByte('/')
			}
		} else {
			b.WriteString(pf.Address)
			if pf.Dev != "" {
				b.WriteString("%" + pf.Dev)
			}
			if pf.Address != "" || pf.Dev != "" {
				b.WriteByte('/')
			}
		}
		if len(pf.Ranges) == 0 {
			b.WriteString("all")
		}
		for i, r := range pf.Ranges {
			if i > 0 {
				b.WriteByte(',')
			}
			if r.Exclude {
				b.WriteByte('~')
			}
			fmt.Fprintf(&b, "%d", r.Start)
			if r.End != 0 {
				fmt.Fprintf(&b, "-%d", r.End)
			}
			if r.To != 0 {
				fmt.Fprintf(&b, ":%d", r.To)
				if r.End != 0 {
					fmt.Fprintf(&b, "-%d", r.End+r.To-r.Start)
				}
			}
		}
		args = append(args, b.String())
	}
	return args
}

// Libvirt90Netdev is the -netdev libvirt 9.0.0 gives QEMU for the same
// interface (qemuPasstAddNetProps, rendered as JSON since QEMU 7.0 takes
// -netdev so): a stream client of passt's socket, no reconnect (libvirt
// 9.0 asks none). id is the netdev id (libvirt's is hostnet<N>).
func Libvirt90Netdev(n LibvirtNet, id string) string {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Addr   any    `json:"addr"`
		Server bool   `json:"server"`
		ID     string `json:"id"`
	}{"stream", struct {
		Type string `json:"type"`
		Path string `json:"path"`
	}{"unix", n.Socket}, false, id})
	return string(b)
}
