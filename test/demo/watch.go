package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// resultReader follows the agent's result file (QEMU's second serial port)
// and hands out each complete line once.
type resultReader struct {
	path string
	off  int
}

// next returns the results completed since the last call.
func (r *resultReader) next() ([]guest.Result, error) {
	b, err := os.ReadFile(r.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	if r.off > len(b) {
		r.off = 0
	}
	chunk := string(b[r.off:])
	end := strings.LastIndexByte(chunk, '\n')
	if end < 0 {
		return nil, nil
	}
	r.off += end + 1
	var out []guest.Result
	for _, line := range strings.Split(chunk[:end], "\n") {
		res, err := guest.ParseResult(line)
		if errors.Is(err, guest.ErrNoResult) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("agent result line %q: %w", line, err)
		}
		out = append(out, res)
	}
	return out, nil
}

// watchGuest prints the agent's results as they arrive and returns once the
// guest has passed every check and powered off.
func (d *demo) watchGuest(ctx context.Context) error {
	rr := &resultReader{path: d.results}
	booted := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		exited := d.qemu.exited() // before reading: the last lines land before the exit
		results, err := rr.next()
		if err != nil {
			return err
		}
		for _, r := range results {
			done, err := d.showResult(r)
			if err != nil {
				return err
			}
			if done {
				d.rep.GuestTook = time.Since(booted)
				if err := d.qemu.wait(15 * time.Second); err != nil {
					return fmt.Errorf("guest finished but QEMU did not exit cleanly: %w", err)
				}
				d.say("guest powered off, QEMU exited (%v after it started)", d.rep.GuestTook.Round(100*time.Millisecond))
				return nil
			}
		}
		if exited {
			return fmt.Errorf("QEMU exited (%v) before the guest finished its checks", d.qemu.err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the guest: %w", ctx.Err())
		case <-d.vunet.done:
			return fmt.Errorf("vunet exited while the guest was running: %v", d.vunet.err)
		case <-d.qemu.done:
		case <-tick.C:
		}
	}
}

// showResult prints one agent result for people; done is true for the
// agent's last line.
func (d *demo) showResult(r guest.Result) (done bool, err error) {
	f := r.Fields
	if !r.OK {
		detail := f["detail"]
		if detail == "" {
			detail = r.String()
		}
		return false, fmt.Errorf("guest check %q failed: %s", r.Name, detail)
	}
	switch r.Name {
	case guest.ResultBoot:
		d.say("guest: Linux %s booted, test agent running (uptime %ss)", f["kernel"], f["uptime"])
	case guest.CheckLink:
		d.say("guest: eth0 up, MAC %s, MTU %s: virtio-net, its rings served by vunet over vhost-user", f["mac"], f["mtu"])
	case guest.CheckDHCP:
		d.rep.Lease = f
		d.say("guest: DHCP lease from vunet in %s ms: %s/%s, router %s, DNS %s, MTU %s", f["ms"], f["ip"], f["mask"], f["router"], orNone(f["dns"]), orNone(f["mtu"]))
	case guest.CheckHTTP:
		d.rep.HTTP = f
		match := "matches the page the server sent"
		if f["sha256"] != d.web.sha256 {
			return false, fmt.Errorf("guest received %s bytes with sha256 %s; the server sent %d bytes with sha256 %s", f["bytes"], f["sha256"], len(d.web.page), d.web.sha256)
		}
		d.say("guest: GET http://%s:%d%s -> HTTP %s, %s bytes in %s ms (%s Mbit/s under TCG)", d.rep.Gateway, d.web.port, pagePath, f["status"], f["bytes"], f["ms"], f["mbps"])
		d.detail("sha256 %.12s… %s", f["sha256"], match)
	case guest.ResultDone:
		d.say("guest: all %s checks passed, powering off", f["checks"])
		return true, nil
	default:
		d.say("guest: %s ok", r.Name)
	}
	return false, nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// checkServer confirms the other end: the page was served, over loopback,
// to a socket vunet opened.
func (d *demo) checkServer() error {
	reqs := d.web.requests()
	d.rep.Served = reqs
	for _, r := range reqs {
		if r.Path == pagePath && r.Status == 200 && r.Bytes == len(d.web.page) {
			d.say("web server: served %s (%d bytes) to %s: vunet's host-side socket on loopback", r.Path, r.Bytes, r.Remote)
			return nil
		}
	}
	return fmt.Errorf("the web server never served %s completely (requests: %v)", pagePath, reqs)
}

// showMetrics scrapes vunet's endpoint and prints the counters that tell
// the story. Counters move asynchronously to what the guest reports, so it
// retries briefly until they show the transfer.
func (d *demo) showMetrics(ctx context.Context) error {
	var m qemu.Metrics
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err = d.scrape(ctx)
		if err == nil && m.Sum("vunet_tcp_connects_total") >= 1 &&
			m.Sum("vunet_service_replies_total", "service", "dhcp") >= 2 &&
			m.Sum("vunet_queue_bytes_total", "direction", "to_guest") >= float64(len(d.web.page)) {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("vunet's counters do not show the transfer: tcp_connects=%v dhcp_replies=%v to_guest_bytes=%v (want >=1, >=2, >=%d)",
				m.Sum("vunet_tcp_connects_total"), m.Sum("vunet_service_replies_total", "service", "dhcp"),
				m.Sum("vunet_queue_bytes_total", "direction", "to_guest"), len(d.web.page))
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.rep.Metrics = m
	d.say("vunet's counters (http://%s/metrics):", d.metrics)
	row := func(label, value string) { d.detail("  %-34s %s", label, value) }
	row("frames guest -> host (TX ring)", fmt.Sprintf("%.0f frames, %s",
		m.Sum("vunet_queue_frames_total", "direction", "from_guest"), humanBytes(m.Sum("vunet_queue_bytes_total", "direction", "from_guest"))))
	row("frames host -> guest (RX ring)", fmt.Sprintf("%.0f frames, %s",
		m.Sum("vunet_queue_frames_total", "direction", "to_guest"), humanBytes(m.Sum("vunet_queue_bytes_total", "direction", "to_guest"))))
	row("DHCP replies (OFFER, ACK)", fmt.Sprintf("%.0f", m.Sum("vunet_service_replies_total", "service", "dhcp")))
	row("ARP replies", fmt.Sprintf("%.0f", m.Sum("vunet_service_replies_total", "service", "arp")))
	row("TCP connections to the host", fmt.Sprintf("%.0f connect()ed, %.0f failed",
		m.Sum("vunet_tcp_connects_total"), m.Sum("vunet_tcp_connect_failures_total")))
	row("TCP payload", fmt.Sprintf("%s to the guest, %s from the guest",
		humanBytes(m.Sum("vunet_tcp_payload_bytes_total", "direction", "to_guest")),
		humanBytes(m.Sum("vunet_tcp_payload_bytes_total", "direction", "from_guest"))))
	row("interrupts to the guest", fmt.Sprintf("%.0f sent, %.0f suppressed",
		m.Sum("vunet_queue_notifications_total"), m.Sum("vunet_queue_notifications_suppressed_total")))
	return nil
}
