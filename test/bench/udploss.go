package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	rig "vunet/test/rig/lib"
)

// Where a UDP row's datagrams were lost. A back-end moves a host→guest
// datagram from its flow socket in the host namespace into the guest's RX
// ring; when the ring stays dry longer than that socket's buffer lasts,
// the kernel drops what arrives, and counts it in the namespace's
// RcvbufErrors (/proc/net/snmp), one per receive: a UDP_GRO run of
// datagrams is one. A socket that overflows in the guest namespace (the
// receiving program's) counts there. With the loss split this way a row
// says whether the back-end lost anything itself or only ran out of the
// guest's buffers (vunet_queue_descriptor_waits_total, for vunet).

// Two more places complete the split: the guest namespace's interfaces
// (its TAP, when the sender outruns the front-end that reads it, and a
// veth's queue in the kernel row) and the back-end's own drops
// (vunet_udp_drops_total, for vunet: a host socket that refused a send,
// a full flow table).

// lossProbe is one reading of the counters a UDP row's loss is split by.
type lossProbe struct {
	hostFull, guestFull int64 // RcvbufErrors in the host and guest namespaces
	hasHost, hasGuest   bool  // whether they could be read
	guestIf             int64 // drops counted by the guest namespace's interfaces
	hasGuestIf          bool
	waits               float64 // the back-end's RX descriptor waits (vunet only)
	udpDrops            float64 // the back-end's own UDP drops (vunet only)
	hasWaits            bool    // whether the vunet counters could be read
}

// probeLoss reads t's counters; one it cannot read is marked missing, and
// the note leaves it out.
func probeLoss(ctx context.Context, t *target) lossProbe {
	var p lossProbe
	var err error
	p.hostFull, err = udpRcvbufErrors(t.hostNS)
	p.hasHost = err == nil
	p.guestFull, err = udpRcvbufErrors(t.guestNS)
	p.hasGuest = err == nil
	p.guestIf, err = interfaceDrops(t.guestNS)
	p.hasGuestIf = err == nil
	if t.rig != nil && !t.alone {
		if m, err := t.rig.Metrics(ctx); err == nil && m.Has("vunet_queue_descriptor_waits_total") {
			// vunet_udp_drops_total has no series before a first drop.
			p.waits, p.udpDrops, p.hasWaits = m.Sum("vunet_queue_descriptor_waits_total"), m.Sum("vunet_udp_drops_total"), true
		}
	}
	return p
}

// lossNote describes what changed between two probes around a row.
// A counter missing from either probe is left out.
func lossNote(before, after lossProbe) string {
	var parts []string
	if before.hasHost && after.hasHost {
		parts = append(parts, fmt.Sprintf("%d in the host namespace", after.hostFull-before.hostFull))
	}
	if before.hasGuest && after.hasGuest {
		parts = append(parts, fmt.Sprintf("%d in the guest's", after.guestFull-before.guestFull))
	}
	var s string
	if len(parts) > 0 {
		s = "receives dropped on full sockets: " + strings.Join(parts, ", ")
	}
	var more []string
	if before.hasGuestIf && after.hasGuestIf {
		more = append(more, fmt.Sprintf("frames dropped by the guest namespace's interfaces: %d", after.guestIf-before.guestIf))
	}
	if before.hasWaits && after.hasWaits {
		more = append(more, fmt.Sprintf("dropped by the back-end: %d", int64(after.udpDrops-before.udpDrops)),
			fmt.Sprintf("guest RX ring ran dry %d×", int64(after.waits-before.waits)))
	}
	for _, m := range more {
		if s != "" {
			s += "; "
		}
		s += m
	}
	return s
}

// interfaceDrops sums the receive and transmit drops of network namespace
// ns's interfaces other than loopback (/proc/net/dev).
func interfaceDrops(ns string) (int64, error) {
	dev, err := readNetFile(ns, "dev")
	if err != nil {
		return 0, err
	}
	return devDrops(dev)
}

// readNetFile reads /proc/net/<name> as network namespace ns sees it.
func readNetFile(ns, name string) (b []byte, err error) {
	err = inNetns(ns, func() (err error) {
		// thread-self: /proc/self/net is the namespace of the process's
		// main thread, not of this one.
		b, err = os.ReadFile("/proc/thread-self/net/" + name)
		return err
	})
	return b, err
}

// devDrops sums the rx and tx drop columns of a /proc/net/dev table,
// loopback left out.
func devDrops(dev []byte) (int64, error) {
	var sum int64
	lines := strings.Split(strings.TrimSpace(string(dev)), "\n")
	if len(lines) < 2 || !strings.Contains(lines[1], "drop") {
		return 0, fmt.Errorf("/proc/net/dev: no header")
	}
	for _, line := range lines[2:] {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			return 0, fmt.Errorf("/proc/net/dev: bad line %q", line)
		}
		if strings.TrimSpace(name) == "lo" {
			continue
		}
		// rx: bytes packets errs drop fifo frame compressed multicast;
		// tx: bytes packets errs drop fifo colls carrier compressed.
		fs := strings.Fields(rest)
		if len(fs) < 16 {
			return 0, fmt.Errorf("/proc/net/dev: %d columns for %s", len(fs), strings.TrimSpace(name))
		}
		for _, i := range []int{3, 11} {
			n, err := strconv.ParseInt(fs[i], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/net/dev: %s: %w", strings.TrimSpace(name), err)
			}
			sum += n
		}
	}
	return sum, nil
}

// udpRcvbufErrors reads the UDP RcvbufErrors of network namespace ns.
func udpRcvbufErrors(ns string) (int64, error) {
	snmp, err := readNetFile(ns, "snmp")
	if err != nil {
		return 0, err
	}
	udp, err := rig.SNMPTable(snmp, "Udp")
	if err != nil {
		return 0, err
	}
	n, ok := udp["RcvbufErrors"]
	if !ok {
		return 0, fmt.Errorf("/proc/net/snmp: no Udp RcvbufErrors")
	}
	return n, nil
}
