package hostile

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	fe "vunet/test/frontend"
	"vunet/vhostuser"
)

// TestClientModeSurvivesHostileFrontEnd runs the back-end in client mode
// (QEMU server=on): the front-end listens, vhostuser.Connect dials it. A
// front-end that sends garbage gets its connection closed; the back-end
// dials again and the next session works, and so does the one after a
// clean hang-up.
func TestClientModeSurvivesHostileFrontEnd(t *testing.T) {
	isolate(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "fe.sock")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- vhostuser.Connect(ctx, path, vhostuser.DeviceConfig{
				QueuePairs: queuePairs, DataPlane: newARPPlane(), Logger: testLogger(),
			})
		}()
		accept := func() *fe.Frontend {
			t.Helper()
			l.SetDeadline(time.Now().Add(10 * time.Second))
			c, err := l.AcceptUnix()
			if err != nil {
				t.Fatalf("back-end did not (re)connect: %v", err)
			}
			f := fe.New(c)
			f.Conn.Timeout = 2 * time.Second
			return f
		}

		// 1: garbage after a valid start.
		f := accept()
		if err := f.Negotiate(fe.Options{}); err != nil {
			t.Fatal(err)
		}
		f.SendRaw(fe.EncodeHeader(fe.ReqSetVringNum, 1, 3), []byte{1, 2, 3}, nil)
		if _, err := f.GetFeatures(); err == nil || !isClosed(err) {
			t.Fatalf("garbage accepted: %v", err)
		}
		f.Close()

		// 2: a normal session after the back-end reconnected.
		f = accept()
		if err := f.Negotiate(fe.Options{Layout: fe.LayoutPCHole}); err != nil {
			t.Fatal(err)
		}
		exchange(t, f)
		f.Close()

		// 3: and again after a clean hang-up.
		f = accept()
		if err := f.Negotiate(fe.Options{}); err != nil {
			t.Fatal(err)
		}
		exchange(t, f)

		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Connect returned %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Connect did not return after cancel with a session active")
		}
		f.Close()
	})
}
