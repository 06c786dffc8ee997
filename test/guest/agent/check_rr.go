package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"vunet/test/guest"
)

// checkRR times 1-byte request/response round trips on one echo
// connection: what an interactive protocol feels through the back-end.
func (a *agent) checkRR(ctx context.Context) guest.Result {
	target, durS, ok := strings.Cut(a.params.Values[guest.ParamRR], ",")
	dur, err := time.ParseDuration(durS)
	if !ok || err != nil || dur <= 0 {
		return fail("%s=%q: want target,duration", guest.ParamRR, a.params.Values[guest.ParamRR])
	}
	addr, err := a.resolveTarget(target)
	if err != nil {
		return fail("%v", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail("dial %s: %v", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("ECHO\n")); err != nil {
		return fail("echo request: %v", err)
	}
	b := []byte{0}
	roundTrip := func(i int) error {
		b[0] = byte(i)
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		if b[0] != byte(i) {
			return fmt.Errorf("echo %d, sent %d", b[0], byte(i))
		}
		return nil
	}
	for i := 0; i < guest.RRWarmup; i++ {
		if err := roundTrip(i); err != nil {
			return fail("warm-up round trip %d: %v", i, err)
		}
	}
	samples := make([]time.Duration, 0, 1<<14)
	for end := time.Now().Add(dur); ; {
		t0 := time.Now()
		if t0.After(end) {
			break
		}
		if err := roundTrip(len(samples)); err != nil {
			return fail("round trip %d: %v", len(samples), err)
		}
		samples = append(samples, time.Since(t0))
	}
	slices.Sort(samples)
	q := func(p float64) string {
		return strconv.FormatInt(samples[min(len(samples)-1, int(p*float64(len(samples))))].Microseconds(), 10)
	}
	return guest.Result{OK: true, Fields: map[string]string{
		"target": addr, "n": strconv.Itoa(len(samples)), "p50_us": q(0.5), "p99_us": q(0.99),
	}}
}
