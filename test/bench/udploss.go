package main

import (
	"context"
	"fmt"
	"os"
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

// lossProbe is one reading of the counters a UDP row's loss is split by.
type lossProbe struct {
	hostFull, guestFull int64   // RcvbufErrors in the host and guest namespaces
	hasHost, hasGuest   bool    // whether they could be read
	waits               float64 // the back-end's RX descriptor waits (vunet only)
	hasWaits            bool
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
	if t.rig != nil && !t.alone {
		if m, err := t.rig.Metrics(ctx); err == nil && m.Has("vunet_queue_descriptor_waits_total") {
			p.waits, p.hasWaits = m.Sum("vunet_queue_descriptor_waits_total"), true
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
	if before.hasWaits && after.hasWaits {
		if s != "" {
			s += "; "
		}
		s += fmt.Sprintf("guest RX ring ran dry %d×", int64(after.waits-before.waits))
	}
	return s
}

// udpRcvbufErrors reads the UDP RcvbufErrors of network namespace ns.
func udpRcvbufErrors(ns string) (int64, error) {
	var snmp []byte
	err := inNetns(ns, func() (err error) {
		// thread-self: /proc/self/net is the namespace of the process's
		// main thread, not of this one.
		snmp, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
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
