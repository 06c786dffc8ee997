package vhostuser

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuffer collects log output from several goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// qemuStart plays QEMU 7.2's start-up sequence for one queue pair
// (FIELD-NOTES), with REPLY_ACK, and returns the call eventfds it kept.
func qemuStart(t *testing.T, fe *frontend, g *guestMem) {
	t.Helper()
	if f := fe.callU64(ReqGetFeatures); f != DefaultFeatures {
		t.Fatalf("features %#x", f)
	}
	if p := fe.callU64(ReqGetProtocolFeatures); p != OfferedProtocolFeatures {
		t.Fatalf("protocol features %#x", p)
	}
	fe.send(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))
	if n := fe.callU64(ReqGetQueueNum); n != 1 {
		t.Fatalf("queue num %d", n)
	}
	if n := fe.callU64(ReqGetMaxMemSlots); n != MaxMemSlots {
		t.Fatalf("max mem slots %d", n)
	}
	fe.send(ReqSetOwner, 0, nil)
	for i := 0; i < 2; i++ {
		fe.send(ReqSetVringCall, 0, u64(uint64(i)), eventfd(t))
		fe.send(ReqSetVringErr, 0, u64(uint64(i)), eventfd(t))
		fe.send(ReqSetVringEnable, 0, state(uint32(i), 0))
	}
	if v := fe.ack(ReqNetSetMTU, u64(1500)); v != 0 {
		t.Fatalf("NET_SET_MTU ack %d", v)
	}
	// QEMU acks what the guest took and adds LOG_ALL only to migrate.
	fe.send(ReqSetFeatures, 0, u64(DefaultFeatures&^FeatureLogAll))
	fe.send(ReqSetStatus, 0, u64(0x7))
	if v := fe.ack(ReqAddMemReg, memReg(g.spec), g.dupFD(t)); v != 0 {
		t.Fatalf("ADD_MEM_REG ack %d", v)
	}
	qemuRings(t, fe, g)
	fe.send(ReqSetStatus, 0, u64(0xf))
	if s := fe.callU64(ReqGetStatus); s != 0xf {
		t.Fatalf("status %#x", s)
	}
}

// qemuRings sets pair 0's rings up and enables them, as QEMU does once
// the memory is there.
func qemuRings(t *testing.T, fe *frontend, g *guestMem) {
	t.Helper()
	for i := 0; i < 2; i++ {
		fe.send(ReqSetVringNum, 0, state(uint32(i), testRingSize))
		fe.send(ReqSetVringBase, 0, state(uint32(i), 0))
		fe.send(ReqSetVringAddr, 0, addr(g.ringAddr(i)))
		fe.send(ReqSetVringKick, 0, u64(uint64(i)), eventfd(t))
		fe.send(ReqSetVringCall, 0, u64(uint64(i)), eventfd(t))
	}
	for i := 0; i < 2; i++ {
		if v := fe.ack(ReqSetVringEnable, state(uint32(i), 1)); v != 0 {
			t.Fatalf("enable ack %d", v)
		}
	}
}

func TestSessionQEMUSequence(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	dp := newFakeDP()
	dp.setOnStart(drainPopper)
	st := &Stats{}
	g.offer(1, 4, false)
	fe, done := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t), Stats: st})
	qemuStart(t, fe, g)
	qp, ok := dp.pair(0)
	if !ok || !qp.RXEnabled || !qp.TXEnabled {
		t.Fatalf("pair %+v running=%v", qp, ok)
	}
	if m := dp.mtuList(); len(m) != 1 || m[0] != 1500 {
		t.Fatalf("mtus %v", m)
	}
	// Shutdown: SET_STATUS(0), GET_VRING_BASE per ring.
	fe.send(ReqSetStatus, 0, u64(0))
	if r := fe.call(ReqGetVringBase, 0, state(0, 0)); !bytes.Equal(r, state(0, 0)) {
		t.Fatalf("rx base %x", r)
	}
	if r := fe.call(ReqGetVringBase, 0, state(1, 0)); !bytes.Equal(r, state(1, 4)) {
		t.Fatalf("tx base %x", r)
	}
	if st.Connected.Load() != 1 || st.MessageCount(ReqSetVringKick) != 2 || st.MessageCount(ReqSetVringCall) != 4 {
		t.Fatalf("connected %d kicks %d calls %d", st.Connected.Load(), st.MessageCount(ReqSetVringKick), st.MessageCount(ReqSetVringCall))
	}
	fe.c.Close()
	if err := <-done; err != nil {
		t.Fatalf("ServeConn: %v", err)
	}
	if st.Connected.Load() != 0 || st.Sessions.Load() != 1 {
		t.Fatalf("connected %d sessions %d", st.Connected.Load(), st.Sessions.Load())
	}
}

func TestSessionBadMessageClosesConnection(t *testing.T) {
	dp := newFakeDP()
	st := &Stats{}
	fe, done := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t), Stats: st})
	fe.send(ReqSetVringNum, 0, state(0, 3)) // not a power of two, no ack asked
	fe.expectClosed()
	if err := <-done; !errors.Is(err, ErrInvalid) {
		t.Fatalf("ServeConn: %v", err)
	}
	if st.ErrorCount(ErrReasonInvalid) != 1 || st.Connected.Load() != 0 {
		t.Fatalf("invalid %d connected %d", st.ErrorCount(ErrReasonInvalid), st.Connected.Load())
	}
}

func TestSessionBadMessageWithReplyAck(t *testing.T) {
	fe, done := session(t, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
	fe.send(ReqSetProtocolFeatures, 0, u64(ProtocolReplyAck))
	if v := fe.ack(ReqSetVringNum, state(0, 3)); v == 0 {
		t.Fatalf("bad ring size acked as success")
	}
	// The connection stays usable.
	if v := fe.ack(ReqSetVringNum, state(0, 4)); v != 0 {
		t.Fatalf("good ring size failed: %d", v)
	}
	fe.c.Close()
	if err := <-done; err != nil {
		t.Fatalf("ServeConn: %v", err)
	}
}

func TestSessionGarbageClosesConnection(t *testing.T) {
	st := &Stats{}
	fe, done := session(t, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t), Stats: st})
	fe.c.Write(bytes.Repeat([]byte{0xee}, 40))
	fe.expectClosed()
	if err := <-done; !errors.Is(err, ErrMalformed) {
		t.Fatalf("ServeConn: %v", err)
	}
	if st.ErrorCount(ErrReasonMalformed) != 1 {
		t.Fatalf("malformed %d", st.ErrorCount(ErrReasonMalformed))
	}
}

func TestSessionCancel(t *testing.T) {
	a, b := socketPair(t)
	defer a.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- ServeConn(ctx, b, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)}) }()
	(&frontend{t: t, c: a}).sync()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeConn after cancel: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("ServeConn did not return after cancel")
	}
	(&frontend{t: t, c: a}).expectClosed()
}

// TestSessionDisconnectCleanup drops the front-end with rings running: the
// pair is stopped, memory unmapped, descriptors closed.
func TestSessionDisconnectCleanup(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	dp := newFakeDP()
	fe, done := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t)})
	fe.sync()
	before := openFDs(t)
	qemuStart(t, fe, g)
	if _, ok := dp.pair(0); !ok {
		t.Fatalf("pair not running")
	}
	fe.c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Pairs stop first, then the data plane ends the session (closes flows).
	if ev := dp.takeEvents(); !strings.HasSuffix(ev, "stop 0,end") {
		t.Fatalf("events %q", ev)
	}
	if dp.runningCount() != 0 {
		t.Fatalf("pairs still running")
	}
	// The socket pair's front-end end is closed too: one fewer.
	if n := openFDs(t); n != before-2 {
		t.Fatalf("fds %d, before %d (minus both socket ends)", n, before)
	}
}

func startServe(t *testing.T, cfg ServerConfig, dev DeviceConfig) (context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	// The socket file appears at bind(2), a moment before listen(2):
	// waiting for the file alone, a dial could be refused. Ready says the
	// socket accepts connections.
	ready := make(chan struct{})
	cfg.Ready = func() { close(ready) }
	go func() { done <- Serve(ctx, cfg, dev) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Serve returned before listening: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve not listening within 5s")
	}
	if fi, err := os.Lstat(cfg.Path); err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != permOr(cfg.Mode) {
		t.Fatalf("socket file %v (%v), want a socket with mode %#o", fi, err, permOr(cfg.Mode))
	}
	t.Cleanup(cancel)
	return cancel, done
}

func permOr(m os.FileMode) os.FileMode {
	if m == 0 {
		return 0o600
	}
	return m.Perm()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func dial(t *testing.T, path string) *frontend {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &frontend{t: t, c: c.(*net.UnixConn)}
}

func TestServeSocketMode(t *testing.T) {
	for _, mode := range []os.FileMode{0, 0o660, 0o777} {
		t.Run(fmt.Sprintf("%#o", mode), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "vu.sock")
			cancel, done := startServe(t, ServerConfig{Path: path, Mode: mode}, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode().Perm() != permOr(mode) {
				t.Fatalf("mode %v err %v", fi.Mode(), err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Serve: %v", err)
			}
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("socket file left behind: %v", err)
			}
		})
	}
}

func TestServeStaleAndLiveSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vu.sock")
	// A stale socket: bound, then the listener died without unlinking.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	dev := DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)}
	cancel, done := startServe(t, ServerConfig{Path: path}, dev)
	dial(t, path).sync()

	// A second Serve on the same path finds a live listener.
	err = Serve(t.Context(), ServerConfig{Path: path}, dev)
	if !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second Serve: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Not a socket: left alone.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("keep"), 0o600)
	if err := Serve(t.Context(), ServerConfig{Path: file}, dev); err == nil {
		t.Fatalf("Serve over a regular file succeeded")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatalf("regular file clobbered")
	}
}

func TestServeSecondConnectionRejected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vu.sock")
	var logs logBuffer
	st := &Stats{}
	_, _ = startServe(t, ServerConfig{Path: path}, DeviceConfig{DataPlane: newFakeDP(), Logger: logs.logger(), Stats: st})
	first := dial(t, path)
	first.sync()
	second := dial(t, path)
	second.expectClosed()
	waitFor(t, func() bool { return st.ErrorCount(ErrReasonRejected) == 1 })
	want := fmt.Sprintf("pid=%d uid=%d gid=%d", os.Getpid(), os.Getuid(), os.Getgid())
	if !strings.Contains(logs.String(), "connection rejected") || !strings.Contains(logs.String(), want) {
		t.Fatalf("log lacks rejection with %q:\n%s", want, logs.String())
	}
	// The first front-end is unaffected.
	first.sync()
	if st.Sessions.Load() != 1 {
		t.Fatalf("sessions %d", st.Sessions.Load())
	}
}

// TestServeReconnectAfterMidSetupDisconnect: a front-end leaves in the
// middle of set-up; the next one gets a clean device.
func TestServeReconnectAfterMidSetupDisconnect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vu.sock")
	g := newGuestMem(t, testGPA, testUA, testSize)
	dp := newFakeDP()
	st := &Stats{}
	_, _ = startServe(t, ServerConfig{Path: path}, DeviceConfig{DataPlane: dp, Logger: testLogger(t), Stats: st})

	first := dial(t, path)
	first.send(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))
	first.send(ReqSetFeatures, 0, u64(DefaultFeatures))
	first.ack(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
	first.send(ReqSetVringNum, 0, state(0, testRingSize))
	first.send(ReqSetVringKick, 0, u64(0), eventfd(t))
	first.sync()
	first.c.Close()
	waitFor(t, func() bool { return st.Connected.Load() == 0 })
	if st.Features.Load() != 0 {
		t.Fatalf("features survive the session")
	}

	second := dial(t, path)
	// Fresh device: no protocol features yet, so NEED_REPLY gets no ack;
	// GET_VRING_BASE sees the ring's initial state.
	if r := second.call(ReqGetVringBase, 0, state(0, 0)); !bytes.Equal(r, state(0, 0)) {
		t.Fatalf("ring state leaked across sessions: %x", r)
	}
	g.offer(1, 2, false)
	dp.setOnStart(drainPopper)
	qemuStart(t, second, g)
	if r := second.call(ReqGetVringBase, 0, state(1, 0)); !bytes.Equal(r, state(1, 2)) {
		t.Fatalf("tx base %x", r)
	}
	if st.Sessions.Load() != 2 || st.Connected.Load() != 1 {
		t.Fatalf("sessions %d connected %d", st.Sessions.Load(), st.Connected.Load())
	}
}

func TestServeOneOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vu.sock")
	_, done := startServe(t, ServerConfig{Path: path, OneOff: true}, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
	fe := dial(t, path)
	fe.sync()
	fe.c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("OneOff Serve did not return")
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket file left behind: %v", err)
	}
}

// TestConnectReconnects plays a QEMU server=on: the back-end connects,
// the listener goes away and comes back, and the back-end connects again.
func TestConnectReconnects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qemu.sock")
	listen := func() *net.UnixListener {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	accept := func(l *net.UnixListener) *frontend {
		l.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := l.AcceptUnix()
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return &frontend{t: t, c: c}
	}
	st := &Stats{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l := listen()
	done := make(chan error, 1)
	go func() {
		done <- Connect(ctx, path, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t), Stats: st})
	}()

	fe := accept(l)
	fe.sync()
	fe.c.Close()
	l.Close() // QEMU gone: dials fail for a while
	time.Sleep(300 * time.Millisecond)
	l = listen()
	defer l.Close()
	fe = accept(l)
	fe.sync()
	if st.Sessions.Load() != 2 {
		t.Fatalf("sessions %d", st.Sessions.Load())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("Connect did not return after cancel")
	}
}

// TestSessionFrontEndNotReading: a front-end that sends requests and never
// reads the replies fills the socket; the session's blocked reply write
// must give way to a cancel (the daemon's shutdown) and, without one, to
// the message timeout.
func TestSessionFrontEndNotReading(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cancel bool
	}{{"cancelled", true}, {"timed out", false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := socketPair(t)
			defer a.Close()
			// Small buffers: a few hundred replies fill them.
			a.SetReadBuffer(4096)
			b.SetWriteBuffer(4096)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- ServeConn(ctx, b, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t), MessageTimeout: 300 * time.Millisecond})
			}()
			req := make([]byte, HeaderSize)
			Header{Request: ReqGetFeatures, Flags: FlagVersion1}.Encode(req)
			go func() {
				for {
					a.SetWriteDeadline(time.Now().Add(3 * time.Second))
					if _, err := a.Write(req); err != nil {
						return
					}
				}
			}()
			// Wait until the session blocks in a reply write: its socket
			// buffer stays full.
			time.Sleep(200 * time.Millisecond)
			if tc.cancel {
				cancel()
			}
			select {
			case err := <-done:
				if tc.cancel && err != nil {
					t.Fatalf("ServeConn after cancel: %v", err)
				}
				if !tc.cancel && (!errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "reply not taken")) {
					t.Fatalf("ServeConn returned %v, want a reply that timed out", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("ServeConn still blocked in a reply nobody reads")
			}
		})
	}
}
