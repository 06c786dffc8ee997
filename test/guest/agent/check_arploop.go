package main

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// checkARPLoop keeps resolving the target for a while and records when
// answers arrive. Gaps show a back-end outage, answers near the end show it
// came back, without the agent having to know when the host restarted it.
func (a *agent) checkARPLoop(ctx context.Context) guest.Result {
	target := net.ParseIP(a.params.Values[guest.ParamARP]).To4()
	if target == nil {
		target = net.ParseIP(firstWord(a.lease["router"])).To4()
	}
	if target == nil {
		return fail("no ARP target: set %s or run the dhcp check first", guest.ParamARP)
	}
	dur := guest.DefaultARPLoop
	if v := a.params.Values[guest.ParamARPLoop]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fail("%s=%q: want a positive duration", guest.ParamARPLoop, v)
		}
		dur = d
	}
	pc, err := openPacket(ifName, unix.ETH_P_ARP)
	if err != nil {
		return fail("%v", err)
	}
	defer pc.Close()
	req := arpRequestFrame(pc.mac, ifaceIPv4(ifName), target)
	buf := make([]byte, 2048)
	start := time.Now()
	end := start.Add(dur)
	var sent, replies, sendErrs int
	var last, maxGap time.Duration
	for next := start; time.Now().Before(end) && ctx.Err() == nil; {
		if !time.Now().Before(next) {
			// A send can fail while the link is down during a back-end
			// restart; that is part of what is measured, not a check error.
			if err := pc.send(req); err != nil {
				sendErrs++
			} else {
				sent++
			}
			next = next.Add(guest.ARPLoopInterval)
		}
		n, err := pc.recv(buf, time.Until(next)+time.Millisecond)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return fail("receive: %v", err)
		}
		if _, spa, ok := parseARPReply(buf[:n]); ok && spa.Equal(target) {
			now := time.Since(start)
			if g := now - last; g > maxGap {
				maxGap = g
			}
			last = now
			replies++
		}
	}
	if g := time.Since(start) - last; g > maxGap {
		maxGap = g
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	return guest.Result{OK: replies > 0, Fields: map[string]string{
		"target": target.String(), "sent": strconv.Itoa(sent), "send_errors": strconv.Itoa(sendErrs),
		"replies": strconv.Itoa(replies), "max_gap_ms": ms(maxGap), "last_reply_ms": ms(last),
		"duration_ms": ms(time.Since(start)),
	}}
}
