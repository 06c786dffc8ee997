package hostile

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	fe "vunet/test/frontend"
	"vunet/vhostuser"
)

// socketPair returns two connected stream sockets.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return mk(fds[0]), mk(fds[1])
}

// FuzzSession throws arbitrary bytes at a negotiated session served by
// vhostuser.ServeConn (the device state is real: memory mapped, pair 0
// running). The first input byte chooses how many eventfds ride along with
// the bytes. The session may close, but must not panic, and ServeConn must
// return promptly once the front-end hangs up.
func FuzzSession(f *testing.F) {
	f.Add([]byte{0})
	f.Add(append([]byte{1}, fe.EncodeHeader(fe.ReqSetVringKick, 1|fe.FlagNeedReply, 8)...))
	f.Add(append(append([]byte{0}, fe.EncodeHeader(fe.ReqSetVringNum, 1|fe.FlagNeedReply, 8)...), fe.PayloadVringState(200, 3)...))
	f.Add(append(append([]byte{0}, fe.EncodeHeader(fe.ReqSetVringAddr, 1, 40)...), fe.VringAddr{Index: 1, Desc: 1 << 40}.Encode()...))
	f.Add(append(append([]byte{2}, fe.EncodeHeader(fe.ReqSetMemTable, 1, 40)...), fe.PayloadMemTable([]fe.Region{{Size: 1 << 30}})...))
	f.Add(append(append([]byte{0}, fe.EncodeHeader(fe.ReqGetVringBase, 1, 8)...), fe.PayloadVringState(1, 0)...))
	f.Add(append(append([]byte{0}, fe.EncodeHeader(fe.ReqRemMemReg, 1, 40)...), make([]byte, 40)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		nfds := int(in[0] % 4)
		in = in[1:]
		a, b := socketPair(t)
		plane := newARPPlane()
		done := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			done <- vhostuser.ServeConn(ctx, b, vhostuser.DeviceConfig{
				QueuePairs: queuePairs, DataPlane: plane, Logger: testLogger(),
			})
		}()
		fr := fe.New(a)
		fr.Conn.Timeout = 2 * time.Second
		if err := fr.Negotiate(fe.Options{RingSize: 16, MemSize: 1 << 20}); err != nil {
			t.Fatalf("negotiate: %v", err)
		}
		var fds []int
		for i := 0; i < nfds; i++ {
			fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			fds = append(fds, fd)
		}
		if len(in) > 0 {
			fr.SendRaw(in, nil, fds)
		}
		// Let the server act on whatever it got, then hang up.
		fr.Conn.UnixConn().SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		buf := make([]byte, 4096)
		fr.Conn.UnixConn().Read(buf)
		fr.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("ServeConn did not return 5 s after the front-end hung up")
		}
	})
}
