package main

import (
	"net"
	"testing"
)

// TestLoopback runs both kinds of client against a server on the loopback:
// the counts add up (what was received is at most what was sent, and the
// bytes are whole datagrams) and the loopback, which loses nothing to a
// receiver with room, delivers most of it. A receiver that miscounted
// coalesced receives (one per run instead of 44) would report about 2%.
func TestLoopback(t *testing.T) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go serveOn(c)
	for _, recv := range []bool{false, true} {
		res, err := client(c.LocalAddr().String(), 0.3, 1472, 44, 0, recv)
		if err != nil {
			t.Fatalf("recv=%v: %v", recv, err)
		}
		t.Logf("recv=%v: %+v", recv, res)
		if res.Sent <= 0 || res.Received > res.Sent || res.Bytes != res.Received*1472 {
			t.Fatalf("recv=%v: %+v does not add up", recv, res)
		}
		if res.Received <= res.Sent/20 {
			t.Fatalf("recv=%v: %d of %d datagrams counted", recv, res.Received, res.Sent)
		}
	}
}

// TestControlRoundTrip: a control message reads back as written, and data
// of any other length or content is not taken for one.
func TestControlRoundTrip(t *testing.T) {
	in := ctl{op: opCount, n: [4]int64{1, 1 << 40, -3, 7}}
	m := in.encode()
	if out, ok := parseControl(m); !ok || out != in {
		t.Fatalf("parseControl = %+v %v, want %+v", out, ok, in)
	}
	if _, ok := parseControl(make([]byte, ctlLen)); ok {
		t.Fatal("zeros parsed as a control message")
	}
	if _, ok := parseControl(append(m, 0)); ok {
		t.Fatal("a longer datagram parsed as a control message")
	}
}

// TestPacedRate: with a rate, the sender keeps to it (a paced run sends
// no more than the rate allows, give or take the first send), and
// parseRate reads iperf3's suffixes.
func TestPacedRate(t *testing.T) {
	for in, want := range map[string]float64{"": 0, "0": 0, "10G": 10e9, "500M": 500e6, "64k": 64e3, "1234": 1234} {
		if got, err := parseRate(in); err != nil || got != want {
			t.Fatalf("parseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"fast", "-1G", "NaN", "Inf", "+InfG", "1e308G"} {
		if _, err := parseRate(bad); err == nil {
			t.Fatalf("parseRate(%q) accepted", bad)
		}
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go serveOn(c)
	const bps = 200e6
	res, err := client(c.LocalAddr().String(), 0.5, 1472, 44, bps, false)
	if err != nil {
		t.Fatal(err)
	}
	sent := float64(res.Sent*1472) * 8
	if max := bps*res.Seconds + 44*1472*8; sent > max {
		t.Fatalf("sent %.0f bits in %.2f s at %.0f bit/s: more than %.0f", sent, res.Seconds, bps, max)
	}
	// The loopback takes 200 Mbit/s with room to spare: a pacer that
	// overslept (or sent nothing) falls far short.
	if min := bps * res.Seconds / 2; sent < min {
		t.Fatalf("sent %.0f bits in %.2f s at %.0f bit/s: less than %.0f", sent, res.Seconds, bps, min)
	}
	t.Logf("%+v: %.0f Mbit/s", res, sent/res.Seconds/1e6)
}
