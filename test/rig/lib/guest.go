package rig

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// udhcpcScript is busybox udhcpc's hook: it applies the lease the back-end
// handed out (address, prefix, default route, MTU) and records it for the
// rig, which cannot see udhcpc's environment otherwise.
const udhcpcScript = `#!/bin/sh
# Written by the vunet rig; called by udhcpc with the lease in its environment.
case "$1" in
deconfig)
	ip addr flush dev "$interface"
	ip link set dev "$interface" up
	;;
bound|renew)
	if [ -n "$mtu" ]; then ip link set dev "$interface" mtu "$mtu"; fi
	ip addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	for r in $router; do
		ip route replace default via "$r" dev "$interface"
		break
	done
	echo "ip=$ip mask=${mask:-24} router=$router mtu=$mtu dns=$dns" > "$RIG_LEASE"
	;;
esac
exit 0
`

// tapQueueLen is the guest TAP's queue, in frames: more than a guest TCP
// sender keeps in flight at MTU 1500 with default buffers.
const tapQueueLen = 20000

func (r *Rig) configureGuest(ctx context.Context) error {
	o := r.opts
	// A virtio NIC never drops what the guest transmits: a full TX ring
	// stops the guest's queue. A TAP instead drops once its queue
	// (txqueuelen frames) is full while the bridge waits for TX
	// descriptors, and a guest TCP sender then recovers by retransmission
	// timeouts. A queue deeper than anything in flight keeps the rig as
	// lossless as the device it stands for.
	if err := ip("-n", r.guestNS, "link", "set", tapName, "txqueuelen", strconv.Itoa(tapQueueLen)); err != nil {
		return err
	}
	if o.MTU > 0 {
		if err := ip("-n", r.guestNS, "link", "set", tapName, "mtu", strconv.Itoa(o.MTU)); err != nil {
			return err
		}
	}
	if o.DHCP {
		if err := r.dhcp(ctx); err != nil {
			return err
		}
	} else {
		mtu := o.MTU
		if mtu == 0 {
			mtu = defaultMTU
		}
		for _, args := range [][]string{
			{"link", "set", tapName, "mtu", strconv.Itoa(mtu)},
			{"addr", "add", o.GuestAddr.String(), "dev", tapName},
			{"route", "add", "default", "via", o.GuestGateway.String(), "dev", tapName},
		} {
			if err := ip(append([]string{"-n", r.guestNS}, args...)...); err != nil {
				return err
			}
		}
		r.guestAddr, r.gateway = o.GuestAddr, o.GuestGateway
	}
	if o.MTU > 0 {
		// The caller's MTU wins over the lease's.
		if err := ip("-n", r.guestNS, "link", "set", tapName, "mtu", strconv.Itoa(o.MTU)); err != nil {
			return err
		}
	}
	mtu, err := readMTU(r.guestNS)
	if err != nil {
		return err
	}
	r.mtu = mtu
	return nil
}

// dhcp runs busybox udhcpc once in the guest namespace (foreground, quit
// after the lease, fail after a few discovers).
func (r *Rig) dhcp(ctx context.Context) error {
	udhcpc, err := findUdhcpc()
	if err != nil {
		return err
	}
	script := filepath.Join(r.dir, "udhcpc.sh")
	lease := filepath.Join(r.dir, "dhcp.lease")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		return err
	}
	argv := append(udhcpc, "-i", tapName, "-f", "-q", "-n", "-t", "5", "-T", "1", "-O", "mtu", "-s", script)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", r.guestNS}, argv...)...)
	cmd.Env = append(os.Environ(), "RIG_LEASE="+lease)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s := &r.stats
		return fmt.Errorf("udhcpc in %s: %w\n%s\nrig: tx %d frames, rx %d frames, tap write errors %d, device errors %d, data path: %v\n%s\nback-end log:\n%s",
			r.guestNS, err, out, s.TXFrames.Load(), s.RXFrames.Load(), s.RXWriteErrors.Load(), s.DeviceErrors.Load(), r.Err(), r.RingState(), tail(r.BackendLog(), 20))
	}
	b, err := os.ReadFile(lease)
	if err != nil {
		return fmt.Errorf("udhcpc left no lease: %w\n%s", err, out)
	}
	kv := map[string]string{}
	for _, f := range strings.Fields(string(b)) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	a, err := netip.ParseAddr(kv["ip"])
	if err != nil {
		return fmt.Errorf("lease %q: address: %w", b, err)
	}
	bits, err := strconv.Atoi(kv["mask"])
	if err != nil {
		return fmt.Errorf("lease %q: prefix: %w", b, err)
	}
	r.guestAddr = netip.PrefixFrom(a, bits)
	if gw, err := netip.ParseAddr(kv["router"]); err == nil {
		r.gateway = gw
	} else {
		return fmt.Errorf("lease %q: no router", b)
	}
	r.opts.Log.Info("dhcp lease", "lease", strings.TrimSpace(string(b)))
	return nil
}

// findUdhcpc prefers a udhcpc on PATH, else busybox's applet.
func findUdhcpc() ([]string, error) {
	if p, err := exec.LookPath("udhcpc"); err == nil {
		return []string{p}, nil
	}
	if p, err := exec.LookPath("busybox"); err == nil {
		return []string{p, "udhcpc"}, nil
	}
	return nil, fmt.Errorf("udhcpc not found (apt-get install busybox)")
}

// readMTU asks the namespace's netlink (a socket made inside it) for the
// TAP's MTU; /sys would show the namespace of whoever mounted it.
func readMTU(ns string) (int, error) {
	mtu := 0
	err := inNetns(ns, func() error {
		ifi, err := net.InterfaceByName(tapName)
		if err != nil {
			return err
		}
		mtu = ifi.MTU
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("mtu of %s in %s: %w", tapName, ns, err)
	}
	return mtu, nil
}
