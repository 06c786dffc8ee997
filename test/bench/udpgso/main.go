// Command udpgso is the bench's UDP sender and receiver with segmentation
// offload, as a QUIC stack uses it: the sender hands the kernel runs of
// datagrams in one send (UDP_SEGMENT), the receiver takes what the kernel
// kept together in one receive (UDP_GRO). iperf3 (3.12 here) does
// neither, so its UDP rows cannot show what USO does on the path.
//
//	udpgso serve -listen IP:PORT        # host side; sessions one at a time
//	udpgso send -to IP:PORT -t 3 [-b 10G]  # guest→host: send for 3 s, print JSON
//	udpgso recv -to IP:PORT -t 3 [-b 10G]  # host→guest: the server sends for 3 s
//
// Data datagrams are -len bytes (1472: an MTU 1500 link), -segs of them a
// send. Control messages are ctlLen-byte datagrams starting with magic,
// sent only after a pause behind the data, so that no receive coalesces
// one with data. The result is one JSON object: datagrams sent and
// received, bytes received, seconds.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

const (
	magic  = "vunet-udpgso\x00"
	ctlLen = 64
	// The pause before a control message: a run in flight is delivered
	// (and its GRO flushed) long before.
	ctlPause = 50 * time.Millisecond
)

// Control operations.
const (
	opReset = 'S' // the client is about to send: count from zero
	opEnd   = 'E' // the client sent what it sent: reply with opCount
	opCount = 'R' // the server's count: received datagrams, bytes
	opBlast = 'B' // send to me for the given seconds
	opDone  = 'D' // the server's blast is over: sent datagrams
)

// result is what a client prints.
type result struct {
	Sent     int64   `json:"sent"`
	Received int64   `json:"received"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: udpgso serve|send|recv [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "", "serve: `IP:PORT` to listen on")
	to := fs.String("to", "", "send, recv: the server's `IP:PORT`")
	secs := fs.Float64("t", 3, "`seconds` of sending")
	dlen := fs.Int("len", 1472, "datagram payload `bytes`")
	segs := fs.Int("segs", 44, "datagrams per send (UDP_SEGMENT)")
	rate := fs.String("b", "", "send at this `rate` in bits/s, K/M/G suffixes as iperf3's -b (default: unpaced)")
	fs.Parse(os.Args[2:])
	bps, err := parseRate(*rate)
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpgso:", err)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		err = serve(*listen)
	case "send", "recv":
		var res result
		if res, err = client(*to, *secs, *dlen, *segs, bps, os.Args[1] == "recv"); err == nil {
			err = json.NewEncoder(os.Stdout).Encode(res)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpgso:", err)
		os.Exit(1)
	}
}

// ctl is a control message: an operation and its numbers.
type ctl struct {
	op byte
	n  [4]int64
}

// encode is m on the wire.
func (m ctl) encode() []byte {
	b := make([]byte, ctlLen)
	copy(b, magic)
	b[len(magic)] = m.op
	for i, v := range m.n {
		binary.BigEndian.PutUint64(b[len(magic)+1+8*i:], uint64(v))
	}
	return b
}

// parseControl reads a control message; ok is false for data.
func parseControl(b []byte) (m ctl, ok bool) {
	if len(b) != ctlLen || string(b[:len(magic)]) != magic {
		return m, false
	}
	m.op = b[len(magic)]
	for i := range m.n {
		m.n[i] = int64(binary.BigEndian.Uint64(b[len(magic)+1+8*i:]))
	}
	return m, true
}

// pacer spaces sends to a rate in bits per second (0: as fast as the
// kernel takes them), as iperf3's -b does: sends go out back to back
// while behind the schedule, and sleep when more than a millisecond ahead.
type pacer struct {
	start time.Time
	bps   float64
	bits  float64
}

func (p *pacer) wait(sentBytes int) {
	if p.bps <= 0 {
		return
	}
	p.bits += float64(sentBytes) * 8
	due := p.start.Add(time.Duration(p.bits / p.bps * float64(time.Second)))
	if ahead := time.Until(due); ahead > time.Millisecond {
		time.Sleep(ahead)
	}
}

// parseRate reads an iperf3-style rate: bits per second with an optional
// K, M or G (powers of 1000); "" or "0" is unpaced.
func parseRate(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	mult := 1.0
	switch s[len(s)-1] {
	case 'k', 'K':
		mult = 1e3
	case 'm', 'M':
		mult = 1e6
	case 'g', 'G':
		mult = 1e9
	}
	if mult > 1 {
		s = s[:len(s)-1]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v >= 0) || math.IsInf(v*mult, 0) {
		return 0, fmt.Errorf("bad rate %q", s)
	}
	return v * mult, nil
}

// setInt sets an integer socket option on c.
func setInt(c *net.UDPConn, level, opt, v int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, v) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt %d/%d: %w", level, opt, serr)
	}
	return nil
}

// prepare sets the options both ends use: UDP_GRO to receive runs whole,
// large buffers so that the measurement is of the path, not of a socket
// queue.
func prepare(c *net.UDPConn) error {
	if err := setInt(c, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
		return fmt.Errorf("UDP_GRO: %w", err)
	}
	_ = setInt(c, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	_ = setInt(c, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20)
	return nil
}

// receiver counts the data datagrams received on c; next returns the
// control messages among them.
type receiver struct {
	c               *net.UDPConn
	buf, oob        []byte
	datagrams, size int64
}

func newReceiver(c *net.UDPConn) *receiver {
	return &receiver{c: c, buf: make([]byte, 1<<16), oob: make([]byte, unix.CmsgSpace(4))}
}

// next receives once: a control message and its sender, or nil when it
// was data (counted).
func (r *receiver) next() (msg []byte, from *net.UDPAddr, err error) {
	n, oobn, _, from, err := r.c.ReadMsgUDP(r.buf, r.oob)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := parseControl(r.buf[:n]); ok {
		return r.buf[:n], from, nil
	}
	seg := 0
	if msgs, err := unix.ParseSocketControlMessage(r.oob[:oobn]); err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
				seg = int(binary.NativeEndian.Uint32(m.Data))
			}
		}
	}
	k := int64(1)
	if seg > 0 && seg < n {
		k = int64((n + seg - 1) / seg)
	}
	r.datagrams += k
	r.size += int64(n)
	return nil, from, nil
}

// blast sends runs of segs datagrams of dlen bytes to c's peer (to, when
// c is not connected) at bps bits per second (0: unpaced) until the
// deadline and returns the datagrams the kernel took. A send refused for
// a full queue (ENOBUFS, EAGAIN) is a run lost on the sender's side, as
// iperf3 counts it.
func blast(c *net.UDPConn, to *net.UDPAddr, dlen, segs int, bps float64, until time.Time) (int64, error) {
	if err := setInt(c, unix.SOL_UDP, unix.UDP_SEGMENT, dlen); err != nil {
		return 0, fmt.Errorf("UDP_SEGMENT: %w", err)
	}
	defer setInt(c, unix.SOL_UDP, unix.UDP_SEGMENT, 0)
	run := make([]byte, dlen*segs)
	var sent int64
	p := pacer{start: time.Now(), bps: bps}
	for i := 0; ; i++ {
		if i%16 == 0 && time.Now().After(until) {
			return sent, nil
		}
		for k := range segs {
			binary.BigEndian.PutUint64(run[k*dlen:], uint64(sent)+uint64(k))
		}
		var err error
		if to != nil {
			_, err = c.WriteToUDP(run, to)
		} else {
			_, err = c.Write(run)
		}
		p.wait(len(run))
		switch {
		case err == nil:
			sent += int64(segs)
		case errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ECONNREFUSED):
		default:
			return sent, err
		}
	}
}

// serve answers clients one at a time, forever.
func serve(listen string) error {
	addr, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return err
	}
	c, err := net.ListenUDP("udp", addr)
	if err != nil {
		return err
	}
	return serveOn(c)
}

// serveOn serves on c until it fails (closed).
func serveOn(c *net.UDPConn) error {
	if err := prepare(c); err != nil {
		return err
	}
	r := newReceiver(c)
	for {
		b, from, err := r.next()
		if err != nil {
			return err
		}
		m, ok := parseControl(b)
		if !ok {
			continue
		}
		switch m.op {
		case opReset:
			r.datagrams, r.size = 0, 0
		case opEnd:
			c.WriteToUDP(ctl{op: opCount, n: [4]int64{r.datagrams, r.size}}.encode(), from)
		case opBlast:
			// n: milliseconds, datagram length, datagrams a send, bits/s.
			sent, err := blast(c, from, int(m.n[1]), int(m.n[2]), float64(m.n[3]), time.Now().Add(time.Duration(m.n[0])*time.Millisecond))
			if err != nil {
				fmt.Fprintln(os.Stderr, "udpgso: blast:", err)
			}
			time.Sleep(ctlPause)
			for range 10 {
				c.WriteToUDP(ctl{op: opDone, n: [4]int64{sent}}.encode(), from)
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// client runs one test against the server at to: it sends (recv false)
// or has the server send to it.
func client(to string, secs float64, dlen, segs int, bps float64, recv bool) (res result, err error) {
	addr, err := net.ResolveUDPAddr("udp", to)
	if err != nil {
		return res, err
	}
	c, err := net.DialUDP("udp", nil, addr)
	if err != nil {
		return res, err
	}
	defer c.Close()
	if err := prepare(c); err != nil {
		return res, err
	}
	ms := int64(secs * 1000)
	r := newReceiver(c)
	if recv {
		start := time.Now()
		if _, err := c.Write(ctl{op: opBlast, n: [4]int64{ms, int64(dlen), int64(segs), int64(bps)}}.encode()); err != nil {
			return res, err
		}
		c.SetReadDeadline(start.Add(time.Duration(ms)*time.Millisecond + 5*time.Second))
		for {
			b, _, err := r.next()
			if err != nil {
				return res, fmt.Errorf("waiting for the server's end: %w (%d datagrams received)", err, r.datagrams)
			}
			if m, ok := parseControl(b); ok && m.op == opDone {
				res.Sent, res.Seconds = m.n[0], float64(ms)/1000
				break
			}
		}
		res.Received, res.Bytes = r.datagrams, r.size
	} else {
		if _, err := c.Write(ctl{op: opReset}.encode()); err != nil {
			return res, err
		}
		time.Sleep(ctlPause)
		start := time.Now()
		sent, err := blast(c, nil, dlen, segs, bps, start.Add(time.Duration(ms)*time.Millisecond))
		if err != nil {
			return res, err
		}
		res.Sent, res.Seconds = sent, time.Since(start).Seconds()
		time.Sleep(ctlPause)
		for try := 0; ; try++ {
			if try == 50 {
				return res, errors.New("no count from the server")
			}
			c.Write(ctl{op: opEnd}.encode())
			c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			b, _, err := r.next()
			if err != nil {
				continue
			}
			if m, ok := parseControl(b); ok && m.op == opCount {
				res.Received, res.Bytes = m.n[0], m.n[1]
				break
			}
		}
	}
	return res, nil
}
