package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"vunet/test/guest"
)

// checkTCPHold runs a migration's workload (guest.CheckTCPHold): a held
// echo connection, a paced download and new connections, at once, for the
// duration.
func (a *agent) checkTCPHold(ctx context.Context) guest.Result {
	f := strings.Split(a.params.Values[guest.ParamTCPHold], ",")
	if len(f) != 3 {
		return fail("%s=%q: want target,duration,bytes", guest.ParamTCPHold, a.params.Values[guest.ParamTCPHold])
	}
	dur, err1 := time.ParseDuration(f[1])
	size, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || dur <= 0 || size <= 0 {
		return fail("%s=%q: want target,duration,bytes", guest.ParamTCPHold, a.params.Values[guest.ParamTCPHold])
	}
	addr, err := a.resolveTarget(f[0])
	if err != nil {
		return fail("%v", err)
	}
	r := guest.Result{Fields: map[string]string{"target": addr}}
	var mu sync.Mutex
	set := func(k, v string) { mu.Lock(); r.Fields[k] = v; mu.Unlock() }
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	wg.Add(3)
	holdOK, downOK, newOK := false, false, false
	go func() { defer wg.Done(); holdOK = holdEcho(ctx, addr, end, set) }()
	go func() { defer wg.Done(); downOK = pacedDownload(ctx, addr, size, dur, set) }()
	go func() { defer wg.Done(); newOK = newConnLoop(ctx, addr, end, set) }()
	wg.Wait()
	r.OK = holdOK && downOK && newOK
	return r
}

// holdEcho echoes one byte every TCPLoopInterval on one connection until
// end and reports the longest time between two echoes.
func holdEcho(ctx context.Context, addr string, end time.Time, set func(k, v string)) bool {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		set("hold_error", "dial: "+err.Error())
		return false
	}
	defer c.Close()
	if _, err := io.WriteString(c, guest.ReqEcho+"\n"); err != nil {
		set("hold_error", err.Error())
		return false
	}
	var echoes int
	var maxGap time.Duration
	last := time.Now()
	defer func() {
		set("echoes", strconv.Itoa(echoes))
		set("hold_max_gap_ms", strconv.FormatInt(maxGap.Milliseconds(), 10))
	}()
	buf := []byte{0}
	for b := byte(1); time.Now().Before(end) && ctx.Err() == nil; b++ {
		time.Sleep(guest.TCPLoopInterval)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte{b}); err != nil {
			set("hold_error", fmt.Sprintf("echo %d: write: %v", echoes+1, err))
			return false
		}
		if _, err := io.ReadFull(c, buf); err != nil || buf[0] != b {
			set("hold_error", fmt.Sprintf("echo %d: got %d, %v", echoes+1, buf[0], err))
			return false
		}
		now := time.Now()
		maxGap = max(maxGap, now.Sub(last))
		last = now
		echoes++
	}
	return echoes > 0
}

// pacedDownload reads a DOWN transfer of size bytes at the pace that makes
// it last dur, hashing it.
func pacedDownload(ctx context.Context, addr string, size int64, dur time.Duration, set func(k, v string)) bool {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		set("down_error", "dial: "+err.Error())
		return false
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(c, "%s %d %d\n", guest.ReqDown, size, rand.Uint64()); err != nil {
		set("down_error", err.Error())
		return false
	}
	h := sha256.New()
	br := bufio.NewReaderSize(c, 64<<10)
	buf := make([]byte, 64<<10)
	start := time.Now()
	var n int64
	for n < size {
		k, err := br.Read(buf[:min(int64(len(buf)), size-n)])
		h.Write(buf[:k])
		n += int64(k)
		if err != nil {
			set("down_error", fmt.Sprintf("after %d bytes: %v", n, err))
			break
		}
		// Pace: byte n is due at start + dur*n/size.
		if due := start.Add(time.Duration(float64(dur) * float64(n) / float64(size))); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
	}
	set("down_bytes", strconv.FormatInt(n, 10))
	set("down_sha256", hex.EncodeToString(h.Sum(nil)))
	return n == size
}

// newConnLoop opens a new echo connection every TCPLoopInterval until end.
func newConnLoop(ctx context.Context, addr string, end time.Time, set func(k, v string)) bool {
	start := time.Now()
	var tries, oks int
	var last, maxGap time.Duration
	for next := start; time.Now().Before(end) && ctx.Err() == nil; next = next.Add(guest.TCPLoopInterval) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		tries++
		if err := echoOnce(ctx, addr, byte(tries)); err != nil {
			continue
		}
		now := time.Since(start)
		maxGap = max(maxGap, now-last)
		last = now
		oks++
	}
	set("new_ok", strconv.Itoa(oks))
	set("new_tries", strconv.Itoa(tries))
	set("new_max_gap_ms", strconv.FormatInt(maxGap.Milliseconds(), 10))
	return oks > 0
}
