package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"vunet/test/guest"
)

// leaseFile is where the hook leaves the lease for the agent: udhcpc passes
// the lease to its script in the environment, which dies with the script.
const leaseFile = "/run/vunet-dhcp.env"

// checkDHCP runs busybox udhcpc once in the foreground; the hook configures
// eth0 the way a distribution's script would, so later checks run over a
// normally configured interface.
func (a *agent) checkDHCP(ctx context.Context) guest.Result {
	if s, _ := sysNet(ifName, "operstate"); s != "up" {
		_ = setUp(ifName)
	}
	_ = os.MkdirAll("/run", 0o755)
	_ = os.Remove(leaseFile)
	cmd := exec.CommandContext(ctx, "/bin/udhcpc", "-i", ifName, "-s", "/bin/"+dhcpHookName,
		"-f", "-q", "-n", "-t", "5", "-T", "2", "-O", "mtu", "-O", "search")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	lease, lerr := readLease()
	if err != nil || lerr != nil {
		return fail("udhcpc: %v; lease: %v; output: %s", err, lerr, lastLines(out.String(), 6))
	}
	a.lease = lease
	r := guest.Result{OK: true, Fields: map[string]string{
		"ip": lease["ip"], "mask": lease["mask"], "router": lease["router"], "dns": lease["dns"],
		"mtu": lease["mtu"], "domain": lease["domain"], "search": lease["search"], "lease": lease["lease"],
		"serverid": lease["serverid"], "hostname": lease["hostname"],
	}}
	if mtu, err := sysNet(ifName, "mtu"); err == nil {
		r.Fields["if_mtu"] = mtu
	}
	if lease["hook_error"] != "" {
		r.OK = false
		r.Fields["detail"] = "hook: " + lease["hook_error"]
	}
	return r
}

func readLease() (map[string]string, error) {
	f, err := os.Open(leaseFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		m[k] = v
	}
	return m, sc.Err()
}

// runDHCPHook is udhcpc's event script: on a lease it configures eth0 and
// records the lease for the agent.
func runDHCPHook(args []string) int {
	if len(args) == 0 {
		return 1
	}
	iface := os.Getenv("interface")
	switch args[0] {
	case "deconfig":
		// IPv4 only, like busybox's simple.script: flushing every
		// address takes the IPv6 link-local one too, and with it the
		// guest's router solicitations (a link-local address flushed
		// during its DAD is never made again, and no RS goes out).
		_ = exec.Command("/bin/ip", "-4", "addr", "flush", "dev", iface).Run()
		_ = exec.Command("/bin/ip", "link", "set", iface, "up").Run()
		return 0
	case "bound", "renew":
	default:
		return 0
	}
	lease := map[string]string{}
	for _, k := range []string{"ip", "mask", "subnet", "router", "dns", "mtu", "domain", "search", "lease", "serverid", "broadcast", "hostname"} {
		lease[k] = os.Getenv(k)
	}
	if lease["mask"] == "" && lease["subnet"] != "" {
		if m := net.ParseIP(lease["subnet"]).To4(); m != nil {
			ones, _ := net.IPMask(m).Size()
			lease["mask"] = strconv.Itoa(ones)
		}
	}
	var errs []string
	run := func(args ...string) {
		if out, err := exec.Command("/bin/ip", args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Sprintf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out))))
		}
	}
	run("-4", "addr", "flush", "dev", iface)
	if lease["mtu"] != "" {
		run("link", "set", iface, "mtu", lease["mtu"])
	}
	run("addr", "add", lease["ip"]+"/"+lease["mask"], "dev", iface)
	for _, r := range strings.Fields(lease["router"]) {
		run("route", "add", "default", "via", r, "dev", iface, "onlink")
		break
	}
	var rc strings.Builder
	if lease["search"] != "" || lease["domain"] != "" {
		fmt.Fprintf(&rc, "search %s\n", strings.TrimSpace(lease["search"]+" "+lease["domain"]))
	}
	for _, d := range strings.Fields(lease["dns"]) {
		fmt.Fprintf(&rc, "nameserver %s\n", d)
	}
	_ = os.MkdirAll("/etc", 0o755)
	if err := os.WriteFile("/etc/resolv.conf", []byte(rc.String()), 0o644); err != nil {
		errs = append(errs, err.Error())
	}
	lease["hook_error"] = strings.Join(errs, "; ")
	var b strings.Builder
	for k, v := range lease {
		fmt.Fprintf(&b, "%s=%s\n", k, strconv.Quote(v))
	}
	if err := os.WriteFile(leaseFile, []byte(b.String()), 0o644); err != nil {
		return 1
	}
	return 0
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
