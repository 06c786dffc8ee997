package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"vunet/test/guest"
)

// streamingBytes is what the streaming check asks for in each direction:
// more than a TCG guest moves before it powers off, so the transfers are
// still running then.
const streamingBytes = int64(1) << 40

// streamingEchoes is how many idle echo connections the streaming check
// holds and closes as it returns.
const streamingEchoes = 200

// checkStreaming starts a download, an upload and a datagram stream that
// outlive the check (guest.CheckStreaming): their sockets are never
// closed, the guest powers off with all three still moving data. The
// echo connections it holds are closed as it returns.
func (a *agent) checkStreaming(ctx context.Context) guest.Result {
	addr, err := a.resolveTarget(a.params.Values[guest.ParamStreaming])
	if err != nil {
		return fail("%v", err)
	}
	var d net.Dialer
	down, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail("dial for the download: %v", err)
	}
	up, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		down.Close()
		return fail("dial for the upload: %v", err)
	}
	udp, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return fail("dial for the datagrams: %v", err)
	}
	// Echo connections closed when the check returns: their FIN
	// exchanges run into the poweroff too (the shutdown that hung
	// TestQEMUGuestTCPConnections came right after its 500 closes).
	echoes := make([]net.Conn, 0, streamingEchoes)
	defer func() {
		for _, c := range echoes {
			c.Close()
		}
	}()
	for range streamingEchoes {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_, err = io.WriteString(c, guest.ReqEcho+"\n")
		}
		if err != nil {
			return fail("echo connection %d: %v", len(echoes), err)
		}
		echoes = append(echoes, c)
	}
	var downN, upN, udpN atomic.Int64
	var downErr, upErr atomic.Pointer[error]
	if _, err := fmt.Fprintf(down, "%s %d %d\n", guest.ReqDown, streamingBytes, rand.Uint64()); err != nil {
		return fail("download request: %v", err)
	}
	if _, err := fmt.Fprintf(up, "%s %d\n", guest.ReqUp, streamingBytes); err != nil {
		return fail("upload request: %v", err)
	}
	downBuf, upBuf := make([]byte, 256<<10), make([]byte, 256<<10)
	src := guest.NewStream(rand.Uint64())
	go moveUntilError(&downN, &downErr, func() (int, error) { return down.Read(downBuf) })
	go moveUntilError(&upN, &upErr, func() (int, error) {
		_, _ = src.Read(upBuf)
		return up.Write(upBuf)
	})
	go func() {
		// Datagrams to the echo service: the guest transmits right up
		// to the poweroff (a TCP sender stalls once its window is
		// full), and the echoes keep the receive side busy.
		buf := make([]byte, 1400)
		for {
			if _, err := udp.Write(buf); err != nil {
				// ENOBUFS, or ECONNREFUSED from an ICMP error: a retry
				// at once would spin the guest's only vCPU.
				time.Sleep(time.Millisecond)
				continue
			}
			udpN.Add(1)
		}
	}()
	err = waitFor(ctx, "both transfers under way", func() bool {
		return (downN.Load() >= guest.StreamingMin && upN.Load() >= guest.StreamingMin) ||
			downErr.Load() != nil || upErr.Load() != nil
	})
	r := guest.Result{Fields: map[string]string{
		"target":     addr,
		"down_bytes": strconv.FormatInt(downN.Load(), 10),
		"up_bytes":   strconv.FormatInt(upN.Load(), 10),
		"udp_sent":   strconv.FormatInt(udpN.Load(), 10),
		"echo_conns": strconv.Itoa(len(echoes)),
	}}
	switch {
	case err != nil:
		r.Fields["detail"] = err.Error()
	case downErr.Load() != nil:
		r.Fields["detail"] = "download: " + (*downErr.Load()).Error()
	case upErr.Load() != nil:
		r.Fields["detail"] = "upload: " + (*upErr.Load()).Error()
	default:
		r.OK = true
	}
	return r
}

// moveUntilError runs step until it fails, adding the bytes each call
// moved to n and keeping the error in errp.
func moveUntilError(n *atomic.Int64, errp *atomic.Pointer[error], step func() (int, error)) {
	for {
		k, err := step()
		n.Add(int64(k))
		if err != nil {
			errp.Store(&err)
			return
		}
	}
}
