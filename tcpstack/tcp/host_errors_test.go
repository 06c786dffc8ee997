package tcp

import (
	"bytes"
	"io"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// Host-side errors the translation must survive without losing guest data
// or leaving a connection behind: refused, unreachable and forbidden
// connects, no descriptor for the socket, a host peer resetting in the
// middle of a transfer. (Errors of sendmsg that no real kernel here gives
// on demand are injected in host_errors_fault_test.go.)

// expectSynReset waits for the RST that answers the harness's SYN and
// checks that the connection is gone and the failure counted, as why.
func expectSynReset(t *testing.T, h *tcpHarness, why stats.TCPReason) {
	t.Helper()
	got := h.collect("RST", func(s []tcpSeg) bool { return len(s) > 0 })
	if len(got) != 1 || got[0].flags != header.TCPFlagRST|header.TCPFlagACK || got[0].ack != h.isn+1 ||
		got[0].src != h.remote || got[0].dst != h.guest {
		t.Fatalf("want one RST acking the SYN from %v, got %+v", h.remote, got)
	}
	if h.flow() != nil || h.tab.Len() != 0 {
		t.Fatalf("connection kept after the failed connect")
	}
	if h.stats.ConnectFailures[why].Load() != 1 || sumReasons(&h.stats.ConnectFailures) != 1 {
		t.Fatalf("connect failures %v, want %v=1", reasonCounts(&h.stats.ConnectFailures), why)
	}
}

// TestTCPConnectErrors: whatever error the host's socket() or connect()
// returns at once, the guest's SYN is answered with an RST (as a kernel
// answers a SYN to a closed port), the failure is counted, and the table
// goes on serving: the next SYN connects. These passed before the
// hardening work too.
func TestTCPConnectErrors(t *testing.T) {
	why := map[unix.Errno]stats.TCPReason{unix.ECONNREFUSED: stats.TCPRefused,
		unix.ENETUNREACH: stats.TCPUnreachable, unix.EHOSTUNREACH: stats.TCPUnreachable}
	for _, e := range []unix.Errno{unix.ECONNREFUSED, unix.ENETUNREACH, unix.EHOSTUNREACH, unix.EPERM,
		unix.EACCES, unix.EADDRNOTAVAIL, unix.EMFILE, unix.ENFILE, unix.ENOBUFS} {
		t.Run(e.Error(), func(t *testing.T) {
			want, ok := why[e]
			if !ok {
				want = stats.TCPError
			}
			h := tcpNewHarness(t, Config{})
			ln := h.listen()
			real := h.tab.dial
			h.tab.dial = func(netip.AddrPort, int, int) (int, bool, error) { return -1, false, e }
			h.sendSYN(tcpMss1400ws7)
			expectSynReset(t, h, want)
			h.tab.dial = real
			h.guest = netip.AddrPortFrom(h.guest.Addr(), h.guest.Port()+1)
			h.establish(ln, tcpMss1400ws7)
		})
	}
}

// TestTCPConnectUnroutable: the kernel's own refusals in a private network
// namespace: no route at all (ENETUNREACH), an unreachable route
// (EHOSTUNREACH), a prohibit route (EACCES), a broadcast address
// (ENETUNREACH): each guest SYN gets its RST at once.
func TestTCPConnectUnroutable(t *testing.T) {
	if !testenv.InPrivateNetns(t, nil) {
		return
	}
	for _, args := range [][]string{
		{"link", "add", "fault0", "type", "veth", "peer", "name", "fault0p"},
		{"addr", "add", "10.96.1.1/24", "dev", "fault0"},
		{"link", "set", "fault0", "up"},
		{"link", "set", "fault0p", "up"},
		{"route", "add", "unreachable", "10.97.0.0/16"},
		{"route", "add", "prohibit", "10.98.0.0/16"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	for i, dst := range []string{"10.99.0.1:80", "10.97.0.1:80", "10.98.0.1:80", "10.96.1.255:80"} {
		// A prohibit route says EACCES: neither refused nor unreachable.
		want := []stats.TCPReason{stats.TCPUnreachable, stats.TCPUnreachable, stats.TCPError, stats.TCPUnreachable}[i]
		h := tcpNewHarness(t, Config{})
		h.remote = netip.MustParseAddrPort(dst)
		var gotErr error
		h.tab.dial = func(dst netip.AddrPort, snd, rcv int) (int, bool, error) {
			fd, inProgress, err := hostsock.DialTCP(dst, hostsock.Source{}, snd, rcv)
			gotErr = err
			return fd, inProgress, err
		}
		h.sendSYN(tcpMss1400ws7)
		expectSynReset(t, h, want)
		t.Logf("%d: %s: connect: %v", i, dst, gotErr)
		if gotErr == nil {
			t.Errorf("%s: connect did not fail at once", dst)
		}
	}
}

// TestTCPSocketAtFDLimit: with no descriptor left for the host socket
// (EMFILE from socket()), the guest's SYN is answered with an RST and
// nothing is left behind; once a descriptor is free the guest connects.
func TestTCPSocketAtFDLimit(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	restore := testenv.LimitFDs(t)
	h.sendSYN(tcpMss1400ws7)
	restore()
	expectSynReset(t, h, stats.TCPError)
	h.guest = netip.AddrPortFrom(h.guest.Addr(), h.guest.Port()+1)
	peer := h.establish(ln, tcpMss1400ws7)
	h.sendAck([]byte("after"))
	if b := tcpReadN(t, peer, 5); string(b) != "after" {
		t.Fatalf("peer got %q", b)
	}
}

// TestTCPPeerResetMidTransfer: a host peer that resets while data flows
// both ways: what the guest received is an exact prefix of what the peer
// sent, the guest gets an RST, its later segments get RSTs too (no
// connection is left behind), and nothing spins.
func TestTCPPeerResetMidTransfer(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	sent := guestframe.Pattern(256 << 10)
	go peer.Write(sent)
	// The guest reads part of it, acknowledging as it goes, and sends some.
	var got []byte
	for len(got) < 64<<10 {
		segs := h.pump(50 * time.Millisecond)
		for _, s := range segs {
			if len(s.payload) > 0 && s.seq == h.ack {
				got = append(got, s.payload...)
				h.ack += uint32(len(s.payload))
			}
		}
		h.sendAck(nil)
	}
	h.sendAck(guestframe.Pattern(1000))
	up := make([]byte, 1000)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, up); err != nil || !bytes.Equal(up, guestframe.Pattern(1000)) {
		t.Fatalf("peer read the guest's data: %v", err)
	}
	// The peer resets with data of ours still unread.
	peer.SetLinger(0)
	peer.Close()
	var rst bool
	for i := 0; i < 100 && !rst; i++ {
		for _, s := range h.pump(20 * time.Millisecond) {
			if s.flags.Has(header.TCPFlagRST) {
				rst = true
				break
			}
			if len(s.payload) > 0 && s.seq == h.ack {
				got = append(got, s.payload...)
				h.ack += uint32(len(s.payload))
			}
		}
		if !rst {
			h.sendAck(nil)
		}
	}
	if !rst {
		t.Fatal("no RST to the guest after the peer reset")
	}
	if !bytes.Equal(got, sent[:len(got)]) {
		t.Fatalf("the %d bytes the guest received are not what the peer sent", len(got))
	}
	if h.flow() != nil || h.tab.Len() != 0 {
		t.Fatalf("connection kept after the peer's reset")
	}
	// The guest, not yet aware, sends more: an RST answers it.
	h.sendAck([]byte("late"))
	if segs := h.flush(); len(segs) != 1 || !segs[0].flags.Has(header.TCPFlagRST) {
		t.Fatalf("late guest data answered with %+v, want an RST", segs)
	}
	// Nothing is left to report: the loop would sleep.
	if !h.epollQuiet(100 * time.Millisecond) {
		t.Fatalf("epoll events after the reset")
	}
}
