package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// arpFloodStall is how long the flood waits for an answer before it gives
// up: long enough for the guest kernel's TX watchdog to have fired on a TX
// queue stopped for good (it runs every 5 s and fires once the queue's
// last transmit is 5 s old: up to 10 s after it), so that such a queue
// shows in tx_timeouts and on the console.
const arpFloodStall = 11 * time.Second

// checkARPFlood pushes many ARP requests through the rings with a bounded
// window, so that the back-end's RX side is never asked to queue more than
// the guest has buffers for: every request must get exactly one answer.
func (a *agent) checkARPFlood(ctx context.Context) guest.Result {
	n := guest.DefaultARPFlood
	if v := a.params.Values[guest.ParamARPFlood]; v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 1<<16 {
			return fail("%s=%q: want 1..65536", guest.ParamARPFlood, v)
		}
	}
	pc, err := openPacket(ifName, unix.ETH_P_ARP)
	if err != nil {
		return fail("%v", err)
	}
	defer pc.Close()
	spa := ifaceIPv4(ifName)
	if spa.IsUnspecified() {
		return fail("eth0 has no IPv4 address (set %s): probes are not answered", guest.ParamAddr)
	}
	base := binary.BigEndian.Uint32(guest.ARPFloodBase[:])
	seen := make([]bool, n)
	buf := make([]byte, 2048)
	var sent, replies, unique, dups, strays, retries int
	lastProgress := time.Now()
	start := time.Now()
	for unique < n && ctx.Err() == nil {
		for sent < n && sent-unique < guest.ARPFloodWindow {
			tpa := make(net.IP, 4)
			binary.BigEndian.PutUint32(tpa, base+uint32(sent))
			if err := pc.send(arpRequestFrame(pc.mac, spa, tpa)); err != nil {
				if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
					retries++
					break // the TX queue is full: wait for replies first
				}
				return fail("send request %d: %v", sent, err)
			}
			sent++
		}
		got, err := pc.recv(buf, 200*time.Millisecond)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				if time.Since(lastProgress) > arpFloodStall {
					break // answers stopped coming: report what we have
				}
				continue
			}
			return fail("receive: %v", err)
		}
		_, ip, ok := parseARPReply(buf[:got])
		if !ok {
			continue
		}
		replies++
		i := int(binary.BigEndian.Uint32(ip.To4()) - base)
		if i < 0 || i >= sent {
			strays++
			continue
		}
		if seen[i] {
			dups++
			continue
		}
		seen[i] = true
		unique++
		lastProgress = time.Now()
	}
	el := time.Since(start)
	r := guest.Result{OK: unique == n && dups == 0 && strays == 0, Fields: map[string]string{
		"sent": strconv.Itoa(sent), "replies": strconv.Itoa(replies), "unique": strconv.Itoa(unique),
		"duplicates": strconv.Itoa(dups), "strays": strconv.Itoa(strays), "send_retries": strconv.Itoa(retries),
		"pps":        fmt.Sprintf("%.0f", float64(unique)/el.Seconds()),
		"rx_packets": strconv.FormatUint(statCounter(ifName, "rx_packets"), 10),
		"tx_packets": strconv.FormatUint(statCounter(ifName, "tx_packets"), 10),
		"rx_dropped": strconv.FormatUint(statCounter(ifName, "rx_dropped"), 10),
	}}
	if !r.OK {
		// Which side a stall is on: a TX queue the driver stopped and
		// nothing restarted (its watchdog fired) holds the requests in the
		// guest; otherwise they reached the ring or were lost before it.
		r.Fields["tx_timeouts"] = txTimeouts(ifName)
		r.Fields["detail"] = fmt.Sprintf("%d of %d requests answered", unique, n)
	}
	return r
}

// txTimeouts is the sum of the TX watchdog's timeouts over the interface's
// TX queues, "n/a" when none can be read.
func txTimeouts(iface string) string {
	dirs, _ := filepath.Glob("/sys/class/net/" + iface + "/queues/tx-*")
	var sum uint64
	read := 0
	for _, d := range dirs {
		if n, err := sysNetUint(iface, "queues/"+filepath.Base(d)+"/tx_timeout"); err == nil {
			sum += n
			read++
		}
	}
	if read == 0 {
		return "n/a"
	}
	return strconv.FormatUint(sum, 10)
}
