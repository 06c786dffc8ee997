package dgram

import (
	"net"
	"testing"
	"time"

	"vunet/tcpstack/stats"
)

// TestDropSendsForgetsQueued: datagrams queued from guest memory and then
// dropped (a fault stopped the loop that queued them) never reach the
// socket, even when the next loop's first datagram is of another flow and
// would have flushed them; that datagram goes out alone.
func TestDropSendsForgetsQueued(t *testing.T) {
	srv := loopbackUDP(t)
	ft := newTestTable(4)
	defer ft.CloseFlows()
	ft.now = time.Unix(1_000_000, 0)
	var flows [2]int32
	for k, port := range []uint16{5000, 5001} {
		key := v4Key(port, 53)
		i, ok := ft.adopt(&key, udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr)))
		if !ok {
			t.Fatal("adopt")
		}
		flows[k] = i
	}
	stale := []byte("stale memory, maybe no longer the guest's")
	ft.queueSend(flows[0], [][]byte{stale}, 0, len(stale), len(stale))
	ft.DropSends()
	if n := ft.st.Proto.UDPDrops[stats.FromGuest][stats.DropQueueBroken].Load(); n != 1 {
		t.Errorf("%d datagrams counted as dropped with a broken queue, want 1", n)
	}
	fresh := []byte("fresh")
	ft.queueSend(flows[1], [][]byte{fresh}, 0, len(fresh), len(fresh))
	ft.FlushSends()

	buf := make([]byte, 128)
	srv.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _, err := srv.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "fresh" {
		t.Fatalf("first datagram at the peer: %q, %v; want %q", buf[:n], err, "fresh")
	}
	srv.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := srv.ReadFromUDP(buf); err == nil {
		t.Fatalf("a dropped datagram was sent: %q", buf[:n])
	}
}
