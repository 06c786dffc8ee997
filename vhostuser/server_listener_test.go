package vhostuser

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestServePassedListener: a socket someone else made (systemd socket
// activation) is served as it is, a front-end that connected before Serve
// ran is answered, and the file stays when Serve returns: it is not ours.
func TestServePassedListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vu.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	early := dial(t, path) // queued in the backlog before anyone serves

	cancel, done := startServeListener(t, ServerConfig{Path: path, Mode: 0o600, Listener: l}, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
	if f := early.callU64(ReqGetFeatures); f != DefaultFeatures {
		t.Errorf("GET_FEATURES on the early connection: %#x", f)
	}
	// Mode is the maker's: Serve did not chmod.
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("socket file %v (%v), want its mode 0640 untouched", fi, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Errorf("socket file removed by Serve: %v", err)
	}
	if _, err := l.Accept(); err == nil {
		t.Errorf("listener still open after Serve returned")
	}
}

// startServeListener is startServe for a passed listener: the file's mode
// is not Serve's to check.
func startServeListener(t *testing.T, cfg ServerConfig, dev DeviceConfig) (context.CancelFunc, <-chan error) {
	t.Helper()
	ready := make(chan struct{})
	cfg.Ready = func() { close(ready) }
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, cfg, dev) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Serve returned before serving: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve not serving within 5s")
	}
	return cancel, done
}
