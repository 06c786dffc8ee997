package rig

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// startRig starts a rig for t: torn down by t.Cleanup, with the back-end's
// log tail and the rig's counters in the test log when t failed.
func startRig(t testing.TB, opts Options) *Rig {
	t.Helper()
	needRig(t)
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	// Cleanups run last-registered first: counters, then StartTB's Close,
	// then this check of what Close left.
	var name string
	t.Cleanup(func() {
		for _, ns := range []string{name + "-guest", name + "-host", name + "-peer"} {
			if _, err := os.Stat(netnsDir + "/" + ns); name != "" && err == nil {
				t.Errorf("namespace %s left behind", ns)
			}
		}
	})
	r := StartTB(t, opts)
	name = r.Name()
	t.Cleanup(func() {
		s := r.Stats()
		t.Logf("rig counters: tx %d frames %d bytes (ring full %d), rx %d frames %d bytes (tap write errors %d, slow-reader holds %d), device errors %d",
			s.TXFrames.Load(), s.TXBytes.Load(), s.TXRingFull.Load(), s.RXFrames.Load(), s.RXBytes.Load(),
			s.RXWriteErrors.Load(), s.RXHeldBatches.Load(), s.DeviceErrors.Load())
	})
	return r
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// healthy fails t if the data path or the back-end broke.
func healthy(t testing.TB, r *Rig) {
	t.Helper()
	if err := r.Err(); err != nil {
		t.Errorf("rig data path: %v", err)
	}
	if n := r.Stats().DeviceErrors.Load(); n != 0 {
		t.Errorf("%d device errors on the rings", n)
	}
	if n := r.Stats().RXWriteErrors.Load(); n != 0 {
		t.Errorf("the TAP refused %d frames from the back-end", n)
	}
	if r.BackendExited() {
		t.Errorf("back-end exited during the test")
	}
}

func metrics(t testing.TB, r *Rig) Metrics {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.Metrics(ctx)
	if err != nil {
		t.Fatalf("scrape back-end metrics: %v", err)
	}
	return m
}

func TestRigDHCPAndTCP(t *testing.T) {
	r := startRig(t, Options{DHCP: true})
	// vunet hands out the host namespace's own address and gateway.
	if r.GuestAddr().String() != "10.213.0.2/24" || r.Gateway().String() != "10.213.0.1" {
		t.Fatalf("DHCP lease: %v via %v, want 10.213.0.2/24 via 10.213.0.1", r.GuestAddr(), r.Gateway())
	}
	out, err := r.GuestExec(context.Background(), "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !bytes.Contains(out, []byte("10.213.0.2/24")) {
		t.Fatalf("guest eth0 after DHCP: %s (%v)", out, err)
	}
	out, err = r.GuestExec(context.Background(), "ip", "route", "show", "default")
	if err != nil || !bytes.Contains(out, []byte("via 10.213.0.1 dev eth0")) {
		t.Fatalf("guest default route after DHCP: %s (%v)", out, err)
	}
	const n = 100 << 20
	transfer(t, r, true, n, 60*time.Second, false)
	transfer(t, r, false, n, 60*time.Second, false)
	m := metrics(t, r)
	if tx := m.Sum("vunet_queue_frames_total", `direction="from_guest"`); tx < n/65536 {
		t.Errorf("back-end counted %v TX frames for %d bytes from the guest", tx, n)
	}
	if rx := m.Sum("vunet_queue_bytes_total", `direction="to_guest"`); rx < n {
		t.Errorf("back-end counted %v RX bytes for %d bytes to the guest", rx, n)
	}
	healthy(t, r)
}

func TestRigSmallBuffers(t *testing.T) {
	small := "4096 16384 65536"
	r := startRig(t, Options{DHCP: true, HostSysctls: map[string]string{
		"net.ipv4.tcp_rmem": small,
		"net.ipv4.tcp_wmem": small,
	}})
	out, err := r.HostExec(context.Background(), "cat", "/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem")
	if err != nil || strings.Count(strings.Join(strings.Fields(string(out)), " "), small) != 2 {
		t.Fatalf("back-end namespace sysctls: %q (%v)", out, err)
	}
	const n = 1 << 30
	t.Run("HostToGuest", func(t *testing.T) { transfer(t, r, false, n, 60*time.Second, true) })
	t.Run("GuestToHost", func(t *testing.T) { transfer(t, r, true, n, 60*time.Second, true) })
	healthy(t, r)
}

func TestRigRXStarvation(t *testing.T) {
	r := startRig(t, Options{DHCP: true, RXRingSize: 16, SlowRX: 5 * time.Millisecond})
	const n = 256 << 20
	transfer(t, r, false, n, 90*time.Second, true) // resent as soon as buffers return: no idle second
	healthy(t, r)
	if r.Stats().RXHeldBatches.Load() == 0 {
		t.Errorf("the slow reader never held RX buffers back")
	}
	m := metrics(t, r)
	waited := m.Sum("vunet_queue_descriptor_waits_total")
	t.Logf("vunet_queue_descriptor_waits_total = %v", waited)
	if waited == 0 {
		t.Errorf("vunet_queue_descriptor_waits_total is 0: the 16-entry RX ring never starved the back-end")
	}
	var retrans []string
	for _, name := range m.Names() {
		if strings.Contains(name, "retrans") {
			retrans = append(retrans, name)
		}
	}
	if len(retrans) == 0 {
		t.Logf("back-end exposes no TCP retransmission metric (names: %v): timeout retransmissions not checked", m.Names())
	}
	for _, name := range retrans {
		v := m.Sum(name, `cause="timeout"`)
		t.Logf("%s{cause=\"timeout\"} = %v", name, v)
		if v != 0 {
			t.Errorf("%s{cause=\"timeout\"} = %v: data waited for the guest's retransmission timeout instead of being sent as soon as descriptors returned", name, v)
		}
	}
}

func TestRigUDPAndICMPEcho(t *testing.T) {
	wide := "0 2147483647"
	r := startRig(t, Options{
		HostSysctls:  map[string]string{"net.ipv4.ping_group_range": wide},
		GuestSysctls: map[string]string{"net.ipv4.ping_group_range": wide},
	})
	t.Run("UDP", func(t *testing.T) {
		srv, err := r.HostListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		go func() {
			buf := make([]byte, 65536)
			for {
				k, from, err := srv.ReadFrom(buf)
				if err != nil {
					return
				}
				srv.WriteTo(buf[:k], from)
			}
		}()
		c, err := r.GuestListenPacket("udp4", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		dst := &net.UDPAddr{IP: r.Gateway().AsSlice(), Port: srv.LocalAddr().(*net.UDPAddr).Port}
		buf := make([]byte, 65536)
		g := &stream{s: 99}
		for i, size := range []int{1, 64, 512, 1400, 1472, 1500, 4000, 9000, 32000, 60000} {
			msg := make([]byte, size)
			g.fill(msg)
			if _, err := c.WriteTo(msg, dst); err != nil {
				t.Fatalf("datagram %d (%d bytes): %v", i, size, err)
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			k, from, err := c.ReadFrom(buf)
			if err != nil {
				t.Fatalf("echo of datagram %d (%d bytes): %v", i, size, err)
			}
			if !bytes.Equal(buf[:k], msg) {
				t.Fatalf("echo of datagram %d: %d bytes, want %d identical", i, k, size)
			}
			if fa := from.(*net.UDPAddr); !fa.IP.Equal(dst.IP) || fa.Port != dst.Port {
				t.Fatalf("echo from %v, want %v", from, dst)
			}
		}
	})
	t.Run("ICMP", func(t *testing.T) {
		var fd int
		err := r.InGuest(func() error {
			var err error
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
			return err
		})
		if err != nil {
			t.Fatalf("guest ping socket: %v", err)
		}
		defer unix.Close(fd)
		tv := unix.NsecToTimeval((3 * time.Second).Nanoseconds())
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		dst := &unix.SockaddrInet4{Addr: r.Gateway().As4()}
		buf := make([]byte, 2048)
		for seq := 1; seq <= 5; seq++ {
			payload := []byte(strings.Repeat("vunet-rig ", seq*10))
			req := append([]byte{8, 0, 0, 0, 0, 0, 0, byte(seq)}, payload...) // id and checksum: the kernel's
			if err := unix.Sendto(fd, req, 0, dst); err != nil {
				t.Fatalf("echo request %d: %v", seq, err)
			}
			k, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				t.Fatalf("echo reply %d: %v", seq, err)
			}
			if k != len(req) || buf[0] != 0 || buf[7] != byte(seq) || !bytes.Equal(buf[8:k], payload) {
				t.Fatalf("echo reply %d: type %d seq %d, %d bytes, want type 0 seq %d with the %d-byte payload", seq, buf[0], buf[7], k, seq, len(payload))
			}
		}
	})
	m := metrics(t, r)
	if m.Sum("vunet_queue_frames_total", `direction="from_guest"`) == 0 {
		t.Errorf("back-end counted no frames from the guest")
	}
	healthy(t, r)
}

func TestTUNOffloads(t *testing.T) {
	b := frontend.Bit
	for _, c := range []struct {
		name string
		feat uint64
		want int
	}{
		{"none", 0, 0},
		{"guest offloads only: the TAP reader (our TX) gets nothing", b(frontend.FeatGuestCSUM) | b(frontend.FeatGuestTSO4) | b(frontend.FeatGuestTSO6) | b(frontend.FeatGuestUFO) |
			b(frontend.FeatGuestUSO4) | b(frontend.FeatGuestUSO6), 0},
		{"TSO without CSUM is not allowed", b(frontend.FeatHostTSO4), 0},
		{"csum", b(frontend.FeatCSUM), unix.TUN_F_CSUM},
		{"tso4+6+ecn", b(frontend.FeatCSUM) | b(frontend.FeatHostTSO4) | b(frontend.FeatHostTSO6) | b(frontend.FeatHostECN),
			unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6 | unix.TUN_F_TSO_ECN},
		{"ecn needs tso", b(frontend.FeatCSUM) | b(frontend.FeatHostECN), unix.TUN_F_CSUM},
		{"ufo", b(frontend.FeatCSUM) | b(frontend.FeatHostUFO), unix.TUN_F_CSUM | unix.TUN_F_UFO},
		{"USO without CSUM is not allowed", b(frontend.FeatHostUSO), 0},
		{"uso: both families, the kernel takes them only together", b(frontend.FeatCSUM) | b(frontend.FeatHostUSO),
			unix.TUN_F_CSUM | unix.TUN_F_USO4 | unix.TUN_F_USO6},
		{"guest USO gives the TAP nothing", b(frontend.FeatCSUM) | b(frontend.FeatGuestUSO4) | b(frontend.FeatGuestUSO6), unix.TUN_F_CSUM},
		{"everything the rig accepts", offloadFeatureMask, unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6 | unix.TUN_F_TSO_ECN |
			unix.TUN_F_UFO | unix.TUN_F_USO4 | unix.TUN_F_USO6},
	} {
		if got := tunOffloads(c.feat); got != c.want {
			t.Errorf("%s: tunOffloads(%#x) = %#x, want %#x", c.name, c.feat, got, c.want)
		}
	}
}

// TestRigNoOffloadsMTU1500: with no offload accepted the TAP gets none, so
// every frame the guest sends fits the 1500-byte MTU told to the back-end
// (NET_SET_MTU) and set on the guest; data still moves both ways intact.
func TestRigNoOffloadsMTU1500(t *testing.T) {
	r := startRig(t, Options{FeatureMask: frontend.DefaultFeatureMask, MTU: 1500})
	if f := r.Features(); f&frontend.Bit(frontend.FeatCSUM) != 0 || f&frontend.Bit(frontend.FeatGuestTSO4) != 0 {
		t.Fatalf("features %#x: offloads accepted despite the mask", f)
	}
	if r.MTU() != 1500 {
		t.Fatalf("guest MTU %d, want 1500", r.MTU())
	}
	const n = 32 << 20
	transfer(t, r, true, n, 60*time.Second, false)
	transfer(t, r, false, n, 60*time.Second, false)
	s := r.Stats()
	if avg := s.TXBytes.Load() / max(s.TXFrames.Load(), 1); avg > 12+14+1500 {
		t.Errorf("guest frames average %d bytes: larger than header + 1514 without TSO", avg)
	}
	if s.TXFrames.Load() < n/1500 || s.RXFrames.Load() < n/1500 {
		t.Errorf("%d TX and %d RX frames for %d bytes each way at MTU 1500", s.TXFrames.Load(), s.RXFrames.Load(), n)
	}
	healthy(t, r)
}

// TestRigAlone moves data both ways between two kernel namespaces through
// the rig's front-end and its copying device, with no back-end: the bytes
// (hashed end to end) and the bridge and device counters must agree, and
// in a request/response exchange each frame must go from one TAP to the
// other on the thread that read it (crossDevice). Its five loops (two bridges' TX and RX, the device) hold
// a P each while the rig runs, on top of GOMAXPROCS, and give them back on
// Close (procs.go).
func TestRigAlone(t *testing.T) {
	for _, mtu := range []int{1500, 65520} {
		t.Run(strconv.Itoa(mtu), func(t *testing.T) {
			procs := runtime.GOMAXPROCS(0)
			r := startRig(t, Options{Loopback: true, MTU: mtu})
			if n, p := reservedPCount(), runtime.GOMAXPROCS(0); n != 5 || p != procs+5 {
				t.Errorf("rig alone up: %d Ps reserved, GOMAXPROCS %d; want 5 and %d", n, p, procs+5)
			}
			if r.BackendPID() != 0 || r.Gateway() != loopbackPeer.Addr() || r.MTU() != mtu {
				t.Fatalf("rig alone: back-end pid %d, peer %v, mtu %d", r.BackendPID(), r.Gateway(), r.MTU())
			}
			e := rigAloneEnds(r)
			const n = 64 << 20
			transferBetween(t, e, true, n, 60*time.Second, false)
			transferBetween(t, e, false, n, 60*time.Second, false)
			s := r.Stats()
			// Each frame crosses the rig twice: read from one TAP (TX),
			// written to the other (RX). The last ACKs may still be on
			// their way when the transfer returns.
			for deadline := time.Now().Add(2 * time.Second); s.RXFrames.Load()+s.RXWriteErrors.Load() != s.TXFrames.Load() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if s.TXFrames.Load() == 0 || s.RXFrames.Load()+s.RXWriteErrors.Load() != s.TXFrames.Load() {
				t.Errorf("rig alone: %d frames read from the TAPs, %d written (+%d refused)",
					s.TXFrames.Load(), s.RXFrames.Load(), s.RXWriteErrors.Load())
			}
			if s.RXBytes.Load() < 2*n {
				t.Errorf("rig alone: %d bytes written to the TAPs for %d each way", s.RXBytes.Load(), n)
			}
			// Request and response: each lone frame goes on to the other
			// TAP on the thread that read it; the RX loops write none. A
			// call the device made late in the transfer may still wake
			// a loop (which then finds its frames written): let the
			// counts settle first.
			settle(&s.RXCalls, 100*time.Millisecond, 2*time.Second)
			calls, loopFrames, frames := s.RXCalls.Load(), s.RXLoopFrames.Load(), s.RXFrames.Load()
			pingPong(t, e, 200)
			c, l, f := s.RXCalls.Load()-calls, s.RXLoopFrames.Load()-loopFrames, s.RXFrames.Load()-frames
			if l != 0 || f < 400 {
				t.Errorf("rig alone, 200 round trips: %d frames written, %d of them by the RX loops (woken %d times by calls); want 400 or more and 0",
					f, l, c)
			}
			healthy(t, r)
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if n, p := reservedPCount(), runtime.GOMAXPROCS(0); n != 0 || p != procs {
				t.Errorf("rig alone closed: %d Ps reserved, GOMAXPROCS %d; want 0 and %d", n, p, procs)
			}
		})
	}
}

// settle waits until c has not changed for quiet, or for limit.
func settle(c *atomic.Uint64, quiet, limit time.Duration) {
	v := c.Load()
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); {
		time.Sleep(quiet)
		w := c.Load()
		if w == v {
			return
		}
		v = w
	}
}

// pingPong makes n 1-byte request/response round trips between e's ends.
func pingPong(t *testing.T, e ends, n int) {
	t.Helper()
	l, err := e.listen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		var b [1]byte
		for range n {
			if _, err := io.ReadFull(c, b[:]); err != nil {
				done <- err
				return
			}
			if _, err := c.Write(b[:]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.dial(ctx, l.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	for i := range n {
		b[0] = byte(i)
		if _, err := c.Write(b[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != byte(i) {
			t.Fatalf("round trip %d: %v, byte %d", i, err, b[0])
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
