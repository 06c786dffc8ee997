package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"vunet/test/guest"
)

// resolveTarget turns "host:port" with host a literal or one of the
// guest.Target* tokens into a dialable address.
func (a *agent) resolveTarget(target string) (string, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return "", fmt.Errorf("target %q: %w", target, err)
	}
	switch host {
	case guest.TargetGW4:
		host = firstWord(a.lease["router"])
		if host == "" {
			return "", errors.New("target gw4: no DHCP lease (run the dhcp check first)")
		}
	case guest.TargetGW6:
		host = defaultIPv6Router(ifName)
		if host == "" {
			return "", errors.New("target gw6: no IPv6 default router (run the ipv6 check first)")
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLinkLocalUnicast() {
			host += "%" + ifName
		}
	}
	return net.JoinHostPort(host, port), nil
}

// checkXfer moves a stream of pseudo-random bytes through one TCP
// connection and digests it on this side; the host's server digests its
// side, and the test compares the two.
func (a *agent) checkXfer(ctx context.Context, name string) guest.Result {
	spec := a.params.Values["vunet."+name]
	dir, target, size, err := guest.ParseXferSpec(spec)
	if err != nil {
		return fail("%s: %v", name, err)
	}
	addr, err := a.resolveTarget(target)
	if err != nil {
		return fail("%v", err)
	}
	r := guest.Result{Fields: map[string]string{"dir": dir, "target": addr}}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.Fields["detail"] = "dial: " + err.Error()
		return r
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	start := time.Now()
	h := sha256.New()
	var n int64
	switch dir {
	case guest.XferDown:
		seed := rand.Uint64()
		if _, err = fmt.Fprintf(c, "%s %d %d\n", guest.ReqDown, size, seed); err == nil {
			n, err = io.Copy(h, bufio.NewReaderSize(c, 256<<10))
		}
		if err == nil && n != size {
			err = fmt.Errorf("server closed after %d of %d bytes", n, size)
		}
	case guest.XferUp:
		if _, err = fmt.Fprintf(c, "%s %d\n", guest.ReqUp, size); err == nil {
			n, err = io.CopyBuffer(io.MultiWriter(c, h), io.LimitReader(guest.NewStream(rand.Uint64()), size), make([]byte, 256<<10))
		}
		if err == nil {
			var line string
			line, err = bufio.NewReader(c).ReadString('\n')
			if f := strings.Fields(line); len(f) == 2 {
				r.Fields["peer_bytes"], r.Fields["peer_sha256"] = f[0], f[1]
			} else if err == nil {
				err = fmt.Errorf("server answered %q", line)
			}
		}
	}
	el := time.Since(start)
	sum := hex.EncodeToString(h.Sum(nil))
	r.Fields["bytes"] = strconv.FormatInt(n, 10)
	r.Fields["sha256"] = sum
	r.Fields["mbps"] = fmt.Sprintf("%.1f", float64(n)*8/el.Seconds()/1e6)
	if err != nil {
		r.Fields["detail"] = fmt.Sprintf("after %d bytes: %v", n, err)
		return r
	}
	if dir == guest.XferUp && (r.Fields["peer_sha256"] != sum || r.Fields["peer_bytes"] != strconv.FormatInt(n, 10)) {
		r.Fields["detail"] = "server received other bytes than were sent"
		return r
	}
	r.OK = true
	return r
}

// checkUDPEcho sends one datagram at a time and waits for its echo, so a
// loss is told from a reordering and each size is checked on its own.
func (a *agent) checkUDPEcho(ctx context.Context) guest.Result {
	addr, err := a.resolveTarget(a.params.Values[guest.ParamUDPEcho])
	if err != nil {
		return fail("%v", err)
	}
	// An unconnected socket, as resolvers use: Linux caches a connected
	// UDP socket's TX queue for good, an unconnected one's datagrams go
	// where XPS says at the time (guest.ParamQueueHop moves them).
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fail("resolve %s: %v", addr, err)
	}
	pc, err := net.ListenPacket("udp", ":0")
	if err != nil {
		return fail("udp socket: %v", err)
	}
	defer pc.Close()
	c := &udpPeer{pc: pc, dst: dst}
	buf := make([]byte, 70000)
	var echoed, retries, mismatched int
	var problems []string
	rounds := 1
	if n, err := strconv.Atoi(a.params.Values[guest.ParamUDPEchoRounds]); err == nil && n > 1 {
		rounds = n
	}
	sizes := guest.UDPEchoSizes
	for i := 0; i < rounds*len(sizes); i++ {
		size := sizes[i%len(sizes)]
		p := make([]byte, size)
		_, _ = guest.NewStream(uint64(i + 1)).Read(p)
		p[0] = byte(i) // tells the echoes of different datagrams apart
		got := false
		for try := 0; try < guest.UDPEchoTries && !got && ctx.Err() == nil; try++ {
			if try > 0 {
				retries++
			}
			if _, err := c.Write(p); err != nil {
				problems = append(problems, fmt.Sprintf("send %d bytes: %v", size, err))
				continue
			}
			deadline := time.Now().Add(time.Second)
			for !got {
				_ = c.SetReadDeadline(deadline)
				n, err := c.Read(buf)
				if err != nil {
					break // timeout: send again
				}
				if n > 0 && buf[0] != byte(i) {
					continue // late echo of an earlier datagram
				}
				if !bytes.Equal(buf[:n], p) {
					mismatched++
					problems = append(problems, fmt.Sprintf("echo of %d bytes came back as %d different bytes", size, n))
				}
				got = true
			}
		}
		if got {
			echoed++
		} else {
			problems = append(problems, fmt.Sprintf("%d bytes: no echo", size))
		}
	}
	r := guest.Result{Fields: map[string]string{
		"target": addr, "sent": strconv.Itoa(rounds * len(sizes)), "echoed": strconv.Itoa(echoed),
		"retries": strconv.Itoa(retries), "mismatched": strconv.Itoa(mismatched),
	}}
	if len(problems) > 0 {
		r.Fields["detail"] = strings.Join(problems, "; ")
	}
	r.OK = echoed == rounds*len(sizes) && mismatched == 0
	return r
}

// checkTCPMany holds n echo connections open at the same time before any
// of them echoes, so the back-end has n host sockets live at once.
func (a *agent) checkTCPMany(ctx context.Context) guest.Result {
	target, count, ok := strings.Cut(a.params.Values[guest.ParamTCPMany], ",")
	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 1 || n > 5000 {
		return fail("%s=%q: want target,count", guest.ParamTCPMany, a.params.Values[guest.ParamTCPMany])
	}
	addr, err := a.resolveTarget(target)
	if err != nil {
		return fail("%v", err)
	}
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	var errMu sync.Mutex
	var firstErr error
	var failed atomic.Int32
	note := func(err error) {
		failed.Add(1)
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	start := time.Now()
	// Dial with bounded parallelism: the guest's own SYN backlog towards
	// one peer is the limit otherwise, not the back-end.
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var d net.Dialer
			dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			c, err := d.DialContext(dctx, "tcp", addr)
			if err == nil {
				_, err = io.WriteString(c, guest.ReqEcho+"\n")
			}
			if err != nil {
				note(fmt.Errorf("conn %d: %w", i, err))
				if c != nil {
					c.Close()
				}
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	established := n - int(failed.Load())
	dialed := time.Since(start)
	var echoed atomic.Int32
	for i, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			b := []byte{byte(i)}
			if _, err := c.Write(b); err != nil {
				note(fmt.Errorf("conn %d write: %w", i, err))
				return
			}
			if _, err := io.ReadFull(c, b); err != nil || b[0] != byte(i) {
				note(fmt.Errorf("conn %d echo %v: %w", i, b, err))
				return
			}
			echoed.Add(1)
		}()
	}
	wg.Wait()
	r := guest.Result{Fields: map[string]string{
		"target": addr, "conns": strconv.Itoa(n), "established": strconv.Itoa(established),
		"echoed": strconv.Itoa(int(echoed.Load())), "dial_ms": strconv.FormatInt(dialed.Milliseconds(), 10),
	}}
	if firstErr != nil {
		r.Fields["detail"] = fmt.Sprintf("%d failures, first: %v", failed.Load(), firstErr)
	}
	r.OK = int(echoed.Load()) == n
	return r
}

// checkTCPLoop measures availability: a fresh connection and a one-byte
// echo every interval, each bounded by TCPLoopTryTimeout so that a
// connection lost with a restarted back-end costs one try, not the check.
func (a *agent) checkTCPLoop(ctx context.Context) guest.Result {
	target, durS, ok := strings.Cut(a.params.Values[guest.ParamTCPLoop], ",")
	dur, err := time.ParseDuration(durS)
	if !ok || err != nil || dur <= 0 {
		return fail("%s=%q: want target,duration", guest.ParamTCPLoop, a.params.Values[guest.ParamTCPLoop])
	}
	addr, err := a.resolveTarget(target)
	if err != nil {
		return fail("%v", err)
	}
	start := time.Now()
	var tries, oks int
	var last, maxGap time.Duration
	var lastErr error
	for next := start; time.Since(start) < dur && ctx.Err() == nil; next = next.Add(guest.TCPLoopInterval) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		tries++
		if err := echoOnce(ctx, addr, byte(tries)); err != nil {
			lastErr = err
			continue
		}
		now := time.Since(start)
		if g := now - last; g > maxGap {
			maxGap = g
		}
		last = now
		oks++
	}
	r := guest.Result{Fields: map[string]string{
		"target": addr, "tries": strconv.Itoa(tries), "ok": strconv.Itoa(oks),
		"max_gap_ms":  strconv.FormatInt(maxGap.Milliseconds(), 10),
		"last_ok_ms":  strconv.FormatInt(last.Milliseconds(), 10),
		"duration_ms": strconv.FormatInt(time.Since(start).Milliseconds(), 10),
	}}
	if lastErr != nil {
		r.Fields["last_error"] = lastErr.Error()
	}
	r.OK = oks > 0
	return r
}

func echoOnce(ctx context.Context, addr string, b byte) error {
	ctx, cancel := context.WithTimeout(ctx, guest.TCPLoopTryTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := c.Write([]byte{'E', 'C', 'H', 'O', '\n', b}); err != nil {
		return err
	}
	got := []byte{0}
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if got[0] != b {
		return fmt.Errorf("echo %d, sent %d", got[0], b)
	}
	return nil
}

// checkTCPServe is the guest end of an inbound forward: one connection,
// read to EOF, digest answered and reported.
func (a *agent) checkTCPServe(ctx context.Context) guest.Result {
	port := a.params.Values[guest.ParamTCPServe]
	ln, err := net.Listen("tcp", ":"+port) // dual-stack
	if err != nil {
		return fail("listen :%s: %v", port, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	a.report(guest.Result{Name: guest.ResultTCPServeReady, OK: true, Fields: map[string]string{"port": port}})
	c, err := ln.Accept()
	if err != nil {
		return fail("accept: %v", err)
	}
	defer c.Close()
	stopC := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stopC()
	start := time.Now()
	h := sha256.New()
	n, err := io.Copy(h, bufio.NewReaderSize(c, 256<<10))
	sum := hex.EncodeToString(h.Sum(nil))
	r := guest.Result{Fields: map[string]string{
		"peer": c.RemoteAddr().String(), "bytes": strconv.FormatInt(n, 10), "sha256": sum,
		"mbps": fmt.Sprintf("%.1f", float64(n)*8/time.Since(start).Seconds()/1e6),
	}}
	if err != nil {
		r.Fields["detail"] = fmt.Sprintf("read after %d bytes: %v", n, err)
		return r
	}
	if _, err := fmt.Fprintf(c, "%d %s\n", n, sum); err != nil {
		r.Fields["detail"] = "answer: " + err.Error()
		return r
	}
	r.OK = true
	return r
}

// checkGone waits for eth0 to go away (device_del on the host).
func (a *agent) checkGone(ctx context.Context) guest.Result {
	if err := waitFor(ctx, ifName+" to disappear", func() bool {
		_, err := os.Stat("/sys/class/net/" + ifName)
		return errors.Is(err, os.ErrNotExist)
	}); err != nil {
		return fail("%v", err)
	}
	return guest.Result{OK: true}
}

// udpPeer talks to one address over an unconnected socket: what comes
// from anyone else is ignored.
type udpPeer struct {
	pc  net.PacketConn
	dst *net.UDPAddr
}

func (u *udpPeer) Write(p []byte) (int, error) { return u.pc.WriteTo(p, u.dst) }

func (u *udpPeer) SetReadDeadline(t time.Time) error { return u.pc.SetReadDeadline(t) }

func (u *udpPeer) Read(p []byte) (int, error) {
	for {
		n, from, err := u.pc.ReadFrom(p)
		if err != nil {
			return n, err
		}
		if a, ok := from.(*net.UDPAddr); ok && a.Port == u.dst.Port && a.IP.Equal(u.dst.IP) {
			return n, nil
		}
	}
}
