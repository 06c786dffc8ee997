package hostile

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"vunet/test/frontend"
	"vunet/vhostuser"
	"vunet/virtqueue"
)

// queuePairs offered by the server under test; ring indices 0..2*queuePairs-1
// are valid.
const queuePairs = 2

// childEnv marks a re-executed test binary running one case in isolation.
const childEnv = "VUNET_HOSTILE_CHILD"

// isolate runs fn in a child process (the test binary re-executed for just
// this subtest), so a server crash — a SIGBUS from an unchecked mapping, a
// panic in a data-plane goroutine — fails this case only, with its output,
// instead of killing every other case.
func isolate(t *testing.T, fn func(t *testing.T)) {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		fn(t)
		return
	}
	var parts []string
	for _, p := range strings.Split(t.Name(), "/") {
		parts = append(parts, "^"+regexp.QuoteMeta(p)+"$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("case hung (60 s): server or test blocked\n%s", tail(out))
	}
	if err != nil {
		t.Fatalf("case failed or the process crashed: %v\n%s", err, tail(out))
	}
	if !bytes.Contains(out, []byte("--- PASS")) {
		t.Fatalf("child ran no test\n%s", tail(out))
	}
	if testing.Verbose() {
		t.Logf("child output:\n%s", tail(out))
	}
}

// tail keeps a child's output readable: the start of a crash report (the
// faulting goroutine comes first), else the end.
func tail(b []byte) string {
	const max = 6000
	for _, marker := range []string{"unexpected fault address", "fatal error:", "panic:"} {
		if i := bytes.Index(b, []byte(marker)); i >= 0 {
			return string(b[i:min(len(b), i+max)])
		}
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// server is an in-process vhostuser.Serve on a temporary socket.
type server struct {
	path  string
	stats *vhostuser.Stats
	plane *arpPlane
	errc  chan error
}

func startServer(t *testing.T) *server {
	t.Helper()
	p := newARPPlane()
	s := startServerWith(t, p)
	s.plane = p
	return s
}

// testLogger keeps expected rejections out of the test log unless
// VUNET_HOSTILE_LOG is set.
func testLogger() *slog.Logger {
	lvl := slog.LevelError + 4
	if os.Getenv("VUNET_HOSTILE_LOG") != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// startServerWith serves with the given data plane.
func startServerWith(t *testing.T, dp virtqueue.DataPlane) *server {
	t.Helper()
	return startServerConfig(t, dp, nil)
}

// startServerConfig serves with the given data plane; tune, if not nil,
// adjusts the configurations first (the defaults set Path, QueuePairs,
// DataPlane, Logger and Stats).
func startServerConfig(t *testing.T, dp virtqueue.DataPlane, tune func(*vhostuser.ServerConfig, *vhostuser.DeviceConfig)) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{path: filepath.Join(dir, "vu.sock"), stats: &vhostuser.Stats{}, errc: make(chan error, 1)}
	scfg := vhostuser.ServerConfig{Path: s.path}
	dcfg := vhostuser.DeviceConfig{QueuePairs: queuePairs, DataPlane: dp, Logger: testLogger(), Stats: s.stats}
	if tune != nil {
		tune(&scfg, &dcfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		s.errc <- vhostuser.Serve(ctx, scfg, dcfg)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-s.errc:
			if err != nil {
				t.Errorf("Serve returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return 10 s after cancel")
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(s.path); err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatal("server socket never appeared")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// alive fails the test if Serve has returned.
func (s *server) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.errc:
		s.errc <- err
		t.Fatalf("server stopped: %v", err)
	default:
	}
}

func (s *server) errorCount() uint64 {
	var n uint64
	for i := range s.stats.Errors {
		n += s.stats.Errors[i].Load()
	}
	return n
}

// connect dials and negotiates, retrying while the server is still tearing
// down the previous session (it serves one front-end at a time).
func (s *server) connect(t *testing.T, opts frontend.Options) *frontend.Frontend {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := frontend.Dial(s.path)
		if err == nil {
			f.Conn.Timeout = 2 * time.Second
			err = f.Negotiate(opts)
			if err == nil {
				t.Cleanup(func() { f.Close() })
				return f
			}
			f.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no front-end could negotiate for 5 s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dial connects without negotiating.
func (s *server) dial(t *testing.T) *frontend.Frontend {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := frontend.Dial(s.path)
		if err == nil {
			// The server may still close us as a second front-end: make sure
			// this session is the active one with a round trip.
			f.Conn.Timeout = 2 * time.Second
			if _, err = f.GetFeatures(); err == nil {
				t.Cleanup(func() { f.Close() })
				return f
			}
			f.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("could not connect for 5 s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var (
	guestMAC = [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	guestIP  = [4]byte{10, 0, 2, 15}
	gwIP     = [4]byte{10, 0, 2, 2}
)

func arpRequest() []byte {
	b := make([]byte, 42)
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], guestMAC[:])
	binary.BigEndian.PutUint16(b[12:], 0x0806)
	binary.BigEndian.PutUint16(b[14:], 1)
	binary.BigEndian.PutUint16(b[16:], 0x0800)
	b[18], b[19] = 6, 4
	binary.BigEndian.PutUint16(b[20:], 1)
	copy(b[22:28], guestMAC[:])
	copy(b[28:32], guestIP[:])
	copy(b[38:42], gwIP[:])
	return b
}

// checkARPReply asserts fr answers arpRequest for the gateway address.
func checkARPReply(t *testing.T, fr []byte) {
	t.Helper()
	if len(fr) < 42 || binary.BigEndian.Uint16(fr[12:]) != 0x0806 || binary.BigEndian.Uint16(fr[20:]) != 2 {
		t.Fatalf("not an ARP reply: % x", fr[:min(len(fr), 42)])
	}
	if !bytes.Equal(fr[0:6], guestMAC[:]) || !bytes.Equal(fr[32:38], guestMAC[:]) || !bytes.Equal(fr[28:32], gwIP[:]) || !bytes.Equal(fr[38:42], guestIP[:]) {
		t.Fatalf("ARP reply addresses wrong: % x", fr[:42])
	}
}

// exchange sends an ARP request on pair 0 and expects the reply; every TX
// chain must come back used.
func exchange(t *testing.T, f *frontend.Frontend) {
	t.Helper()
	p := f.Pair0()
	if p.RX.Outstanding() < 4 {
		if err := p.PostRX(8, 2048); err != nil {
			t.Fatalf("post rx: %v", err)
		}
	}
	if err := p.SubmitTX(arpRequest()); err != nil {
		t.Fatalf("submit tx: %v", err)
	}
	frames, err := p.ReceiveRX(3 * time.Second)
	if err != nil {
		t.Fatalf("no ARP reply: %v", err)
	}
	checkARPReply(t, frames[0].Data)
	if err := p.WaitTX(3 * time.Second); err != nil {
		t.Fatalf("tx chains not returned: %v", err)
	}
}

// healthy checks that a new front-end negotiates and exchanges a frame.
func (s *server) healthy(t *testing.T) {
	t.Helper()
	s.alive(t)
	f := s.connect(t, frontend.Options{})
	exchange(t, f)
	f.Close()
	s.alive(t)
}

// outcome is what the server did with a hostile message.
type outcome int

const (
	outClosed   outcome = iota // connection closed
	outNack                    // REPLY_ACK with a non-zero status
	outAccepted                // ack 0, or no reply and the connection still serves
)

func (o outcome) String() string {
	return [...]string{"closed", "nack", "accepted"}[o]
}

// observe reads the server's response to a message just sent: with
// needReply, the status reply; without, a GET_FEATURES round trip tells an
// open connection from a closed one.
func observe(t *testing.T, f *frontend.Frontend, req frontend.Request, needReply bool) outcome {
	t.Helper()
	if !needReply {
		if _, err := f.GetFeatures(); err != nil {
			if isClosed(err) {
				return outClosed
			}
			t.Fatalf("after hostile message: %v", err)
		}
		return outAccepted
	}
	m, err := f.Conn.Recv()
	if err != nil {
		if isClosed(err) {
			return outClosed
		}
		t.Fatalf("waiting for the reply to a hostile message: %v", err)
	}
	if m.Request != req {
		t.Fatalf("reply for request %d, sent %d", m.Request, req)
	}
	if st, _ := m.U64(); st != 0 {
		return outNack
	}
	return outAccepted
}

func isClosed(err error) bool {
	return errors.Is(err, frontend.ErrClosed) || errors.Is(err, io.EOF) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}
