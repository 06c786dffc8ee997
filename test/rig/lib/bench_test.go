package rig

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
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
