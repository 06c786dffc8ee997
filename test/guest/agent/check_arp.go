package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// checkARP resolves the target (vunet.arp, else the DHCP router) by hand so
// that the answer's source MAC and timing can be reported.
func (a *agent) checkARP(ctx context.Context) guest.Result {
	target := net.ParseIP(a.params.Values[guest.ParamARP]).To4()
	if target == nil {
		target = net.ParseIP(firstWord(a.lease["router"])).To4()
	}
	if target == nil {
		return fail("no ARP target: set %s or run the dhcp check first", guest.ParamARP)
	}
	pc, err := openPacket(ifName, unix.ETH_P_ARP)
	if err != nil {
		return fail("%v", err)
	}
	defer pc.Close()
	spa := ifaceIPv4(ifName)
	start := time.Now()
	sha, tries, err := resolveARP(ctx, pc, spa, target)
	if err != nil {
		return guest.Result{Fields: map[string]string{"target": target.String(), "from": spa.String(),
			"tries": strconv.Itoa(tries), "detail": err.Error()}}
	}
	return guest.Result{OK: true, Fields: map[string]string{
		"target": target.String(), "mac": sha.String(), "from": spa.String(),
		"tries": strconv.Itoa(tries), "rtt_us": strconv.FormatInt(time.Since(start).Microseconds(), 10),
		"rx_packets": strconv.FormatUint(statCounter(ifName, "rx_packets"), 10),
	}}
}

// resolveARP asks for target's MAC on pc (an ETH_P_ARP socket) once a
// second until it is answered or ctx ends.
func resolveARP(ctx context.Context, pc *packetConn, spa, target net.IP) (sha net.HardwareAddr, tries int, err error) {
	req := arpRequestFrame(pc.mac, spa, target)
	buf := make([]byte, 2048)
	for ctx.Err() == nil {
		tries++
		if err := pc.send(req); err != nil {
			return nil, tries, fmt.Errorf("send ARP request: %w", err)
		}
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			n, err := pc.recv(buf, time.Until(deadline))
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return nil, tries, fmt.Errorf("receive: %w", err)
			}
			if sha, got, ok := parseARPReply(buf[:n]); ok && got.Equal(target) {
				return sha, tries, nil
			}
		}
	}
	return nil, tries, errors.New("no ARP reply")
}

func firstWord(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i]
		}
	}
	return s
}
