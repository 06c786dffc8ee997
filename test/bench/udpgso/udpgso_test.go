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
		res, err := client(c.LocalAddr().String(), 0.3, 1472, 44, recv)
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
	m := control(opCount, 1, 1<<40, -3)
	op, a, b, c, ok := parseControl(m)
	if !ok || op != opCount || a != 1 || b != 1<<40 || c != -3 {
		t.Fatalf("parseControl = %c %d %d %d %v", op, a, b, c, ok)
	}
	if _, _, _, _, ok := parseControl(make([]byte, ctlLen)); ok {
		t.Fatal("zeros parsed as a control message")
	}
	if _, _, _, _, ok := parseControl(append(m, 0)); ok {
		t.Fatal("a longer datagram parsed as a control message")
	}
}
