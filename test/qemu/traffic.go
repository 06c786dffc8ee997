package qemu

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"vunet/test/guest"
)

// TrafficServer is the host end of the agent's traffic checks: a TCP
// service speaking the guest package's one-line requests (DOWN, UP, ECHO)
// and a UDP echo, on one port of 127.0.0.1 and ::1 — where the daemon
// sends guest connections to the gateway addresses. It records every
// transfer with the digest of the bytes it sent or received, so a test can
// compare both ends' digests.
type TrafficServer struct {
	Port int

	mu        sync.Mutex
	xfers     []XferRecord
	echoConns []time.Time // accept time of each ECHO connection
	echoOpen  int
	echoMax   int // most ECHO connections open at once
	// heldEchoes are the read times of each ended ECHO connection that
	// read at least longEcho times (a held one).
	heldEchoes [][]time.Time
	udpEchoed  int

	downSent atomic.Int64 // bytes written by DOWN transfers so far
	closers  []io.Closer
	wg       sync.WaitGroup
}

// XferRecord is one DOWN or UP transfer as the server saw it.
type XferRecord struct {
	Dir    string // guest.XferDown or guest.XferUp
	Want   int64  // bytes requested
	Bytes  int64  // bytes moved
	SHA256 string
	Peer   string
	Err    error
	Took   time.Duration
	Seed   uint64 // DOWN: the stream's seed (guest.NewStream)
}

// PrefixSHA256 is the sha256 of the first n bytes of a DOWN transfer's
// stream: a guest that got fewer bytes than the server sent can tell
// whether it got their beginning whole (the hash matches) or had bytes
// skipped or changed on the way.
func (r XferRecord) PrefixSHA256(n int64) string {
	h := sha256.New()
	_, _ = io.CopyN(h, guest.NewStream(r.Seed), n)
	return hex.EncodeToString(h.Sum(nil))
}

func (r XferRecord) String() string {
	return fmt.Sprintf("%s %d/%d bytes sha256=%s from %s in %v err=%v", r.Dir, r.Bytes, r.Want, r.SHA256, r.Peer, r.Took.Round(time.Millisecond), r.Err)
}

// StartTrafficServer listens on 127.0.0.1 and ::1 (TCP and UDP, one port),
// inside ns when it is not nil. t.Cleanup stops it.
func StartTrafficServer(t testing.TB, ns *NetNS) *TrafficServer {
	t.Helper()
	s := &TrafficServer{}
	listen := func() error {
		var lastErr error
		for try := 0; try < 20; try++ {
			l4, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				return err
			}
			port := l4.Addr().(*net.TCPAddr).Port
			l6, err6 := net.Listen("tcp6", fmt.Sprintf("[::1]:%d", port))
			u4, erru4 := net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", port))
			u6, erru6 := net.ListenPacket("udp6", fmt.Sprintf("[::1]:%d", port))
			if err := errors.Join(err6, erru4, erru6); err != nil {
				lastErr = err
				l4.Close()
				for _, c := range []io.Closer{l6, u4, u6} {
					if c != nil {
						c.Close()
					}
				}
				continue
			}
			s.Port = port
			s.closers = []io.Closer{l4, l6, u4, u6}
			for _, l := range []net.Listener{l4, l6} {
				s.wg.Add(1)
				go s.acceptLoop(l)
			}
			for _, u := range []net.PacketConn{u4, u6} {
				s.wg.Add(1)
				go s.udpEcho(u)
			}
			return nil
		}
		return fmt.Errorf("no port free on both loopbacks: %w", lastErr)
	}
	var err error
	if ns != nil {
		err = ns.Do(listen)
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatalf("traffic server: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and waits for its connections to end.
func (s *TrafficServer) Close() {
	s.mu.Lock()
	cs := s.closers
	s.closers = nil
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	s.wg.Wait()
}

func (s *TrafficServer) acceptLoop(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

func (s *TrafficServer) serve(c net.Conn) {
	defer c.Close()
	// Bounded life: a guest that vanished (killed QEMU) must not keep a
	// handler, and the test's cleanup, waiting.
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	br := bufio.NewReaderSize(c, 256<<10)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	switch f[0] {
	case guest.ReqEcho:
		s.mu.Lock()
		s.echoConns = append(s.echoConns, time.Now())
		s.echoOpen++
		s.echoMax = max(s.echoMax, s.echoOpen)
		s.mu.Unlock()
		reads := echoTimed(c, br)
		s.mu.Lock()
		s.echoOpen--
		if len(reads) >= longEcho {
			s.heldEchoes = append(s.heldEchoes, reads)
		}
		s.mu.Unlock()
	case guest.ReqDown:
		if len(f) != 3 {
			return
		}
		n, err1 := strconv.ParseInt(f[1], 10, 64)
		seed, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return
		}
		rec := XferRecord{Dir: guest.XferDown, Want: n, Peer: c.RemoteAddr().String(), Seed: seed}
		start := time.Now()
		h := sha256.New()
		st := guest.NewStream(seed)
		buf := make([]byte, 256<<10)
		for rec.Bytes < n {
			k := int(min(int64(len(buf)), n-rec.Bytes))
			_, _ = st.Read(buf[:k])
			w, err := c.Write(buf[:k])
			h.Write(buf[:w])
			rec.Bytes += int64(w)
			s.downSent.Add(int64(w))
			if err != nil {
				rec.Err = err
				break
			}
		}
		rec.SHA256, rec.Took = hex.EncodeToString(h.Sum(nil)), time.Since(start)
		s.record(rec)
	case guest.ReqUp:
		if len(f) != 2 {
			return
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return
		}
		rec := XferRecord{Dir: guest.XferUp, Want: n, Peer: c.RemoteAddr().String()}
		start := time.Now()
		h := sha256.New()
		rec.Bytes, rec.Err = io.CopyN(h, br, n)
		rec.SHA256, rec.Took = hex.EncodeToString(h.Sum(nil)), time.Since(start)
		s.record(rec)
		if rec.Err == nil {
			_, _ = fmt.Fprintf(c, "%d %s\n", rec.Bytes, rec.SHA256)
		}
	}
}

func (s *TrafficServer) record(r XferRecord) {
	s.mu.Lock()
	s.xfers = append(s.xfers, r)
	s.mu.Unlock()
}

func (s *TrafficServer) udpEcho(u net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 70000)
	for {
		n, from, err := u.ReadFrom(buf)
		if err != nil {
			return
		}
		if _, err := u.WriteTo(buf[:n], from); err == nil {
			s.mu.Lock()
			s.udpEchoed++
			s.mu.Unlock()
		}
	}
}

// Xfers returns the transfers finished so far.
func (s *TrafficServer) Xfers() []XferRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]XferRecord(nil), s.xfers...)
}

// DownSent is how many bytes DOWN transfers have written so far.
func (s *TrafficServer) DownSent() int64 { return s.downSent.Load() }

// EchoConns returns the accept times of ECHO connections and the most that
// were open at once.
func (s *TrafficServer) EchoConns() (accepted []time.Time, maxOpen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.echoConns...), s.echoMax
}

// UDPEchoed is how many datagrams the UDP echo answered.
func (s *TrafficServer) UDPEchoed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udpEchoed
}

// CheckXfer asserts that the guest's result r for a transfer of size bytes
// matches, byte for byte, one transfer the server finished: same
// direction, size and SHA-256 on both ends.
func (s *TrafficServer) CheckXfer(t testing.TB, r guest.Result, dir string, size int64) {
	t.Helper()
	if r.Fields["dir"] != dir || r.Fields["bytes"] != strconv.FormatInt(size, 10) {
		t.Errorf("%s: guest moved %s bytes %s, want %d %s", r.Name, r.Fields["bytes"], r.Fields["dir"], size, dir)
	}
	// The server records an upload after reading its last byte, possibly
	// just after the guest printed its result.
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, x := range s.Xfers() {
			if x.Dir == dir && x.SHA256 == r.Fields["sha256"] {
				if x.Err != nil || x.Bytes != size {
					t.Errorf("%s: server side %v", r.Name, x)
				}
				t.Logf("%s: %d bytes byte-exact (sha256 %s…), guest %s Mbit/s, server side %v", r.Name, size, x.SHA256[:16], r.Fields["mbps"], x.Took.Round(time.Millisecond))
				return
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("%s: no server transfer with the guest's digest %s; server saw:\n%v", r.Name, r.Fields["sha256"], s.Xfers())
}

// Target renders the server's address for a guest check's target
// parameter: host (a guest.Target* name or an address) and the server's port.
func (s *TrafficServer) Target(host string) string {
	return net.JoinHostPort(host, strconv.Itoa(s.Port))
}
