package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"vunet/test/guest"
)

// checkEchoServe is the guest end of forwards the host adds and removes
// while the guest runs: TCP and UDP echo on one port for a while.
func (a *agent) checkEchoServe(ctx context.Context) guest.Result {
	port, dur, ok := strings.Cut(a.params.Values[guest.ParamEchoServe], ",")
	d, err := time.ParseDuration(dur)
	if !ok || err != nil {
		return fail("%s=%q: want port,duration", guest.ParamEchoServe, a.params.Values[guest.ParamEchoServe])
	}
	ln, err := net.Listen("tcp", ":"+port) // dual-stack
	if err != nil {
		return fail("listen tcp :%s: %v", port, err)
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		return fail("listen udp :%s: %v", port, err)
	}
	defer pc.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close(); pc.Close() })
	defer stop()

	var conns, bytes, datagrams atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				unstick := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
				defer unstick()
				n, _ := io.Copy(c, c)
				bytes.Add(n)
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			datagrams.Add(1)
			_, _ = pc.WriteTo(buf[:n], from)
			if string(buf[:n]) == guest.EchoServeQuit {
				cancel()
				return
			}
		}
	}()
	a.report(guest.Result{Name: guest.ResultEchoServeReady, OK: true, Fields: map[string]string{"port": port}})
	<-ctx.Done()
	wg.Wait()
	return guest.Result{OK: true, Fields: map[string]string{
		"tcp_conns": strconv.FormatInt(conns.Load(), 10), "tcp_bytes": strconv.FormatInt(bytes.Load(), 10),
		"udp_datagrams": strconv.FormatInt(datagrams.Load(), 10),
	}}
}
