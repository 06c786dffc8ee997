package vhostuser

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
)

// stateDP is a fake data plane with a state to save and load.
type stateDP struct {
	*fakeDP
	mu     sync.Mutex
	save   []byte
	saveOK bool
	loaded []byte
}

func (s *stateDP) SaveState(w io.Writer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.saveOK {
		return errors.New("cannot save")
	}
	_, err := w.Write(s.save)
	return err
}

func (s *stateDP) LoadState(r io.Reader) error {
	b, err := io.ReadAll(r)
	s.mu.Lock()
	s.loaded = b
	s.mu.Unlock()
	return err
}

func stateParams(dir, phase uint32) []byte {
	b := make([]byte, 8)
	b[0], b[4] = byte(dir), byte(phase)
	return b
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// TestDeviceStateTransfer plays a newer QEMU's device-state channel over a
// session: the source saves into a pipe QEMU reads to its end, the
// destination loads what QEMU writes, and CHECK_DEVICE_STATE reports each.
func TestDeviceStateTransfer(t *testing.T) {
	state := bytes.Repeat([]byte("the back-end's state "), 10000) // more than a pipe holds
	dp := &stateDP{fakeDP: newFakeDP(), save: state, saveOK: true}
	fe, _ := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t)})
	if p := fe.callU64(ReqGetProtocolFeatures); p&ProtocolDeviceState == 0 {
		t.Fatalf("DEVICE_STATE not offered: %#x", p)
	}
	fe.send(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))

	// Save: QEMU reads until EOF, then checks.
	r, w := pipe(t)
	if v := fe.callU64Payload(ReqSetDeviceStateFD, stateParams(0, 0), dupFD(t, int(w.Fd()))); v != 1<<8 {
		t.Fatalf("SET_DEVICE_STATE_FD(save) = %#x, want 0x100 (success, no fd)", v)
	}
	w.Close()
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, state) {
		t.Fatalf("read %d bytes (%v), want the %d-byte state", len(got), err, len(state))
	}
	if v := fe.callU64(ReqCheckDeviceState); v != 0 {
		t.Fatalf("CHECK_DEVICE_STATE after a save = %d", v)
	}

	// Load: QEMU writes it all and closes, then checks.
	r, w = pipe(t)
	if v := fe.callU64Payload(ReqSetDeviceStateFD, stateParams(1, 0), dupFD(t, int(r.Fd()))); v != 1<<8 {
		t.Fatalf("SET_DEVICE_STATE_FD(load) = %#x", v)
	}
	r.Close()
	if _, err := w.Write(state); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if v := fe.callU64(ReqCheckDeviceState); v != 0 {
		t.Fatalf("CHECK_DEVICE_STATE after a load = %d", v)
	}
	dp.mu.Lock()
	if !bytes.Equal(dp.loaded, state) {
		t.Errorf("loaded %d bytes, want %d", len(dp.loaded), len(state))
	}
	dp.mu.Unlock()

	// A save that fails is a failed check; a check without a transfer too.
	dp.mu.Lock()
	dp.saveOK = false
	dp.mu.Unlock()
	r, w = pipe(t)
	fe.callU64Payload(ReqSetDeviceStateFD, stateParams(0, 0), dupFD(t, int(w.Fd())))
	w.Close()
	io.ReadAll(r)
	if v := fe.callU64(ReqCheckDeviceState); v == 0 {
		t.Error("CHECK_DEVICE_STATE after a failed save says success")
	}
	if v := fe.callU64(ReqCheckDeviceState); v == 0 {
		t.Error("CHECK_DEVICE_STATE without a transfer says success")
	}
	// Another direction or phase is refused in the reply's encoding.
	for _, p := range [][]byte{stateParams(2, 0), stateParams(0, 1)} {
		_, w := pipe(t)
		if v := fe.callU64Payload(ReqSetDeviceStateFD, p, dupFD(t, int(w.Fd()))); v&0xff == 0 || v&(1<<8) == 0 {
			t.Errorf("params %x: reply %#x, want an error without an fd", p, v)
		}
	}
	fe.sync()
}

// TestDeviceStateNotNegotiated: without DEVICE_STATE the request is
// refused in its reply's encoding, and the session goes on.
func TestDeviceStateNotNegotiated(t *testing.T) {
	dp := &stateDP{fakeDP: newFakeDP(), saveOK: true}
	fe, _ := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t)})
	fe.send(ReqSetProtocolFeatures, 0, u64(ProtocolReplyAck))
	_, w := pipe(t)
	if v := fe.callU64Payload(ReqSetDeviceStateFD, stateParams(0, 0), dupFD(t, int(w.Fd()))); v != 1|1<<8 {
		t.Fatalf("reply %#x, want 0x101", v)
	}
	fe.sync()
}

// callU64Payload sends a request with a payload and descriptors and
// returns its u64 reply.
func (fe *frontend) callU64Payload(req Request, payload []byte, fds ...int) uint64 {
	fe.t.Helper()
	p := fe.call(req, 0, payload, fds...)
	v, err := DecodeU64(p)
	if err != nil {
		fe.t.Fatalf("%v reply: %v", req, err)
	}
	return v
}
