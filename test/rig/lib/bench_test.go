package rig

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// vethEnds builds the reference path: two namespaces joined by a veth pair,
// the kernel alone between them (FIELD-NOTES: the ceiling a user-space
// back-end is measured against, as a ratio in the same run).
func vethEnds(tb testing.TB) ends {
	tb.Helper()
	base := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), rigSeq.Add(1))
	a, b := base+"-vetha", base+"-vethb"
	tb.Cleanup(func() {
		killNetnsPids(a)
		killNetnsPids(b)
		delNetns(a)
		delNetns(b)
	})
	for _, args := range [][]string{
		{"netns", "add", a}, {"netns", "add", b},
		{"-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b},
		{"-n", a, "addr", "add", "10.214.0.1/24", "dev", "va"},
		{"-n", b, "addr", "add", "10.214.0.2/24", "dev", "vb"},
		{"-n", a, "link", "set", "va", "up"}, {"-n", b, "link", "set", "vb", "up"},
		{"-n", a, "link", "set", "lo", "up"}, {"-n", b, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			tb.Fatal(err)
		}
	}
	return ends{
		server:   netip.MustParseAddr("10.214.0.1"),
		inClient: func(fn func() error) error { return inNetns(b, fn) },
		listen: func() (net.Listener, error) {
			var l net.Listener
			err := inNetns(a, func() (err error) { l, err = net.Listen("tcp4", "10.214.0.1:0"); return })
			return l, err
		},
		dial: func(ctx context.Context, port int) (net.Conn, error) {
			var c net.Conn
			err := inNetns(b, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", net.JoinHostPort("10.214.0.1", strconv.Itoa(port)))
				return
			})
			return c, err
		},
	}
}

// BenchmarkRigTCP moves 1 GiB per op through the rig (vunet) and through a
// plain veth pair, in both directions, reporting Gbit/s. Run with
// -benchtime=1x; needs root.
func BenchmarkRigTCP(b *testing.B) {
	needRig(b)
	const n = 1 << 30
	r := startRig(b, Options{DHCP: true})
	veth := vethEnds(b)
	for _, c := range []struct {
		name   string
		e      ends
		toHost bool
	}{
		{"vunet/guest-to-host", rigEnds(r), true},
		{"vunet/host-to-guest", rigEnds(r), false},
		{"veth/guest-to-host", veth, true},
		{"veth/host-to-guest", veth, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(n)
			var bits atomic.Int64
			for i := 0; i < b.N; i++ {
				res := transferBetween(b, c.e, c.toHost, n, 120e9, false)
				bits.Add(int64(res.gbits() * 1000))
			}
			b.ReportMetric(float64(bits.Load())/1000/float64(b.N), "Gbit/s")
		})
	}
}

// echoOn serves a 1-byte echo on e's listening side until the benchmark
// ends and returns its port.
func echoOn(b testing.TB, e ends) int {
	b.Helper()
	l, err := e.listen()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var p [1]byte
				for {
					if _, err := c.Read(p[:]); err != nil {
						return
					}
					if _, err := c.Write(p[:]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// roundTrip writes one byte to c and reads the one that comes back.
func roundTrip(c net.Conn) error {
	var p [1]byte
	if _, err := c.Write(p[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(c, p[:])
	return err
}

// BenchmarkRigRR times 1-byte request/response round trips (one per op)
// through a veth pair, the rig alone and the rig with vunet (rrCases),
// reporting the p50 and p99 in µs. Needs root. The rig alone must not be
// slower than the rig with vunet: it is the rig's own share of that path.
func BenchmarkRigRR(b *testing.B) {
	needRig(b)
	for _, c := range rrCases(b) {
		b.Run(c.name, func(b *testing.B) {
			defer withReservedPs()()
			port := echoOn(b, c.e)
			conn, err := c.e.dial(context.Background(), port)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			rt := func() {
				if err := roundTrip(conn); err != nil {
					b.Fatal(err)
				}
			}
			for range 200 {
				rt()
			}
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				rt()
				samples = append(samples, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// BenchmarkRigConnect opens a connection, exchanges one byte and closes it
// per op (ConnectExchangeClose, on one thread in the guest namespace),
// through the same paths as BenchmarkRigRR, reporting conn/s and the p50
// and slowest connection in µs.
func BenchmarkRigConnect(b *testing.B) {
	needRig(b)
	for _, c := range rrCases(b) {
		b.Run(c.name, func(b *testing.B) {
			defer withReservedPs()()
			port := echoOn(b, c.e)
			server := netip.AddrPortFrom(c.e.server, uint16(port))
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			err := c.e.inClient(func() error {
				for range b.N {
					t0 := time.Now()
					if err := ConnectExchangeClose(server, 5*time.Second); err != nil {
						return err
					}
					samples = append(samples, time.Since(t0))
				}
				return nil
			})
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conn/s")
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(samples[len(samples)-1].Nanoseconds())/1e3, "max-µs")
		})
	}
}

type rrCase struct {
	name string
	e    ends
}

// rrCases are the paths the round-trip benchmarks time, at MTU 65520:
// $RIG_RR_CASES picks some of veth, alone and vunet (default: all three).
func rrCases(b *testing.B) []rrCase {
	sys := map[string]string{"net.ipv4.ip_local_port_range": "10000 65535", "net.ipv4.tcp_tw_reuse": "1"}
	names := os.Getenv("RIG_RR_CASES")
	if names == "" {
		names = "veth,alone,vunet"
	}
	var cs []rrCase
	for _, n := range strings.Split(names, ",") {
		switch n {
		case "veth":
			cs = append(cs, rrCase{n, vethEnds(b)})
		case "alone":
			cs = append(cs, rrCase{n, rigAloneEnds(startRig(b, Options{Loopback: true, MTU: 65520, GuestSysctls: sys, HostSysctls: sys}))})
		case "vunet":
			cs = append(cs, rrCase{n, rigEnds(startRig(b, Options{DHCP: true, MTU: 65520, GuestSysctls: sys, HostSysctls: sys}))})
		}
	}
	return cs
}

// withReservedPs gives back, for one run of a sub-benchmark, the Ps the
// running rigs reserved (procs.go), and returns what puts GOMAXPROCS
// back: the testing package sets it to its -cpu value before every run of
// a benchmark, which takes them away.
func withReservedPs() (restore func()) {
	p := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(p + reservedPCount())
	return func() { runtime.GOMAXPROCS(p) }
}
