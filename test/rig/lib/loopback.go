package rig

import (
	"fmt"
	"net/netip"
	"strconv"

	"vunet/test/frontend"
)

// The rig alone (Options.Loopback): the guest namespace's TAP and a second
// TAP in a peer namespace, each bridged by the rig's front-end to one queue
// pair, with crossDevice copying frames between the pairs instead of a
// back-end. Hosts: the guest (client side) and the peer (server side, what
// HostNetns, HostListen and Gateway name in this mode).
var (
	loopbackGuest = netip.MustParsePrefix("10.216.0.2/24")
	loopbackPeer  = netip.MustParsePrefix("10.216.0.1/24")
)

// loopbackFeatures are the virtio features the rig-alone rings stand for:
// what the rig negotiates with vunet (VERSION_1 header, every offload the
// TAP carries), without MRG_RXBUF, as every RX buffer holds a whole frame.
func loopbackFeatures() uint64 { return frontend.Bit(frontend.FeatVersion1) | supportedOffloads() }

// startLoopback builds the rig-alone data path: one memory, four rings, the
// copying device, two TAPs and their bridges, static addresses.
func (r *Rig) startLoopback() error {
	o := r.opts
	size := max(o.RXRingSize, o.TXRingSize)
	mem, err := frontend.NewMemory(4*uint64(size)*uint64(o.BufSize)+4<<20, frontend.LayoutSingle)
	if err != nil {
		return err
	}
	r.mem = mem
	var pairs [2][2]*frontend.Ring
	for p := range pairs {
		for q := range pairs[p] {
			ring, err := frontend.NewRing(mem, 2*p+q, size, true)
			if err != nil {
				return err
			}
			r.rings = append(r.rings, ring)
			pairs[p][q] = ring
		}
	}
	if r.dev, err = newCrossDevice(mem, pairs, o.Log); err != nil {
		return err
	}
	// Without damage, the device writes to the TAPs itself (crossDevice);
	// an impaired link keeps a thread per RX ring, so that a frame held
	// back to be reordered leaves on its own schedule as before.
	inline := !o.Impair.On()
	var brs [2]*bridge
	const hdrLen = 12 // virtio 1.x header
	offloads := tunOffloads(loopbackFeatures())
	for i, ns := range []string{r.guestNS, r.hostNS} {
		tx, err := pairs[i][1].Fixed(o.BufSize, false)
		if err != nil {
			return err
		}
		rx, err := pairs[i][0].Fixed(o.BufSize, true)
		if err != nil {
			return err
		}
		tap, err := openTAP(ns, hdrLen, offloads)
		if err != nil {
			return err
		}
		if i == 0 {
			r.tap = tap
		} else {
			r.tap2 = tap
		}
		if err := ip("-n", ns, "link", "set", tapName, "up"); err != nil {
			return err
		}
		c := bridgeConfig{tap: tap, hdrLen: hdrLen, tx: []*frontend.FixedRing{tx}, rx: []*frontend.FixedRing{rx},
			slowRX: o.SlowRX, inlineRX: inline, stats: &r.stats, log: o.Log}
		if i == 0 {
			// The guest's side only: each direction is damaged once,
			// as between a guest and a back-end.
			c.impair, c.seed, c.observe, c.observeHdr = o.Impair, 1, o.RXObserve, o.RXObserveHdr
		}
		br, err := newBridge(c)
		if err != nil {
			return err
		}
		side := i
		br.afterPublish = func() { r.dev.pump(side) }
		if i == 0 {
			r.br = br
		} else {
			r.br2 = br
		}
		brs[i] = br
		if inline {
			r.dev.serve[i] = func() error { return br.serveRX(0) }
		}
	}
	r.dev.start()
	for _, br := range brs {
		br.start()
	}
	mtu := o.MTU
	if mtu == 0 {
		mtu = defaultMTU
	}
	for _, side := range []struct {
		ns   string
		addr netip.Prefix
	}{{r.guestNS, loopbackGuest}, {r.hostNS, loopbackPeer}} {
		for _, args := range [][]string{
			{"link", "set", tapName, "txqueuelen", strconv.Itoa(tapQueueLen)},
			{"link", "set", tapName, "mtu", strconv.Itoa(mtu)},
			{"addr", "add", side.addr.String(), "dev", tapName},
		} {
			if err := ip(append([]string{"-n", side.ns}, args...)...); err != nil {
				return fmt.Errorf("rig alone: %w", err)
			}
		}
	}
	r.guestAddr, r.gateway, r.mtu = loopbackGuest, loopbackPeer.Addr(), mtu
	return nil
}
