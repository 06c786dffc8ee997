package handover

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns a connected source and destination, HELLOs exchanged.
func pair(t *testing.T) (src, dst *Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handover.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		var err error
		src, err = Accept(l)
		done <- err
	}()
	dst, err = Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close(); dst.Close() })
	return src, dst
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func inode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatalf("fstat %d: %v", fd, err)
	}
	return st.Ino
}

// TestStateRoundTrip hands over more items and sockets than one message
// carries: every item arrives in order with its bytes, each socket as a new
// descriptor of the same open file.
func TestStateRoundTrip(t *testing.T) {
	src, dst := pair(t)
	before := openFDs(t)
	var items []Item
	var mine []int
	for i := 0; i < 300; i++ {
		it := Item{Kind: KindTCP, Pair: uint16(i % 3), Data: bytes.Repeat([]byte{byte(i)}, i%50), FD: -1}
		if i%3 != 1 {
			fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			mine = append(mine, fd)
			it.FD = fd
		}
		if i%7 == 0 {
			it.Kind = KindDgram
		}
		items = append(items, it)
	}
	done := make(chan error, 1)
	go func() { done <- src.SendState(items) }()
	ev, err := dst.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ev.Abort || ev.Commit || len(ev.Items) != len(items) {
		t.Fatalf("event %+v with %d items, want %d", ev.Abort, len(ev.Items), len(items))
	}
	for i, got := range ev.Items {
		want := items[i]
		if got.Kind != want.Kind || got.Pair != want.Pair || !bytes.Equal(got.Data, want.Data) || (got.FD >= 0) != (want.FD >= 0) {
			t.Fatalf("item %d: %+v, want %+v", i, got, want)
		}
		if got.FD >= 0 {
			if got.FD == want.FD || inode(t, got.FD) != inode(t, want.FD) {
				t.Fatalf("item %d: descriptor %d is not a new descriptor of %d's file", i, got.FD, want.FD)
			}
			unix.Close(got.FD)
		}
	}
	closeAll(mine)
	if n := openFDs(t); n != before {
		t.Errorf("%d descriptors open after the exchange, %d before", n, before)
	}
}

func TestAbortAndCommit(t *testing.T) {
	src, dst := pair(t)
	if err := src.SendAbort(); err != nil {
		t.Fatal(err)
	}
	if ev, err := dst.Receive(); err != nil || !ev.Abort {
		t.Fatalf("%+v %v, want ABORT", ev, err)
	}
	if err := dst.SendCommit(); err != nil {
		t.Fatal(err)
	}
	if ev, err := src.Receive(); err != nil || !ev.Commit {
		t.Fatalf("%+v %v, want COMMIT", ev, err)
	}
	if err := src.SendState(nil); err != nil {
		t.Fatal(err)
	}
	if ev, err := dst.Receive(); err != nil || ev.Abort || ev.Commit || len(ev.Items) != 0 {
		t.Fatalf("%+v %v, want an empty state", ev, err)
	}
	src.Close()
	if _, err := dst.Receive(); !IsClosed(err) {
		t.Fatalf("after the source closed: %v", err)
	}
}

// rawPair is a SOCK_SEQPACKET pair: one end a Conn, the other raw, to send
// what no Conn would.
func rawPair(t *testing.T) (c *Conn, raw int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "handover")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); unix.Close(fds[1]) })
	return newConn(nc.(*net.UnixConn)), fds[1]
}

func rawState(items ...Item) []byte {
	b, err := encodeState(nil, items)
	if err != nil {
		panic(err)
	}
	return b
}

// TestReceiveHostile: whatever the peer sends, Receive fails cleanly and
// closes every descriptor that came with the bad messages.
func TestReceiveHostile(t *testing.T) {
	withFD := Item{Kind: KindTCP, Data: []byte{1}, FD: 0}
	noFD := Item{Kind: KindTCP, Data: []byte{1}, FD: -1}
	badVersion := appendHeader(nil, msgHello, 0, 0)
	badVersion[6] = 99
	hugeCount := appendHeader(nil, msgState, MaxItemsPerMessage+1, 0)
	cases := []struct {
		name string
		msgs [][]byte
		fds  []int // sockets sent with each message
	}{
		{"bad magic", [][]byte{[]byte("XXXXXXXXXXXXXXXXXXXX")}, []int{0}},
		{"short", [][]byte{{1, 2, 3}}, []int{1}},
		{"other version", [][]byte{badVersion}, []int{0}},
		{"more sockets than items", [][]byte{rawState(withFD)}, []int{3}},
		{"fewer sockets than items", [][]byte{rawState(withFD, withFD)}, []int{1}},
		{"sockets on a COMMIT", [][]byte{appendHeader(nil, msgCommit, 0, 0)}, []int{2}},
		{"END count wrong", [][]byte{rawState(noFD, withFD), appendHeader(nil, msgEnd, 3, 0)}, []int{1, 0}},
		{"ABORT inside a state", [][]byte{rawState(withFD), appendHeader(nil, msgAbort, 0, 0)}, []int{1, 0}},
		{"HELLO inside a state", [][]byte{rawState(withFD), appendHeader(nil, msgHello, 0, 0)}, []int{1, 0}},
		{"too many items", [][]byte{hugeCount}, []int{0}},
		{"payload length lies", [][]byte{append(rawState(noFD), 0)}, []int{1}},
		{"unknown type", [][]byte{appendHeader(nil, 77, 0, 0)}, []int{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, raw := rawPair(t)
			before := openFDs(t)
			for i, m := range tc.msgs {
				var oob []byte
				if tc.fds[i] > 0 {
					var fds []int
					for k := 0; k < tc.fds[i]; k++ {
						fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
						if err != nil {
							t.Fatal(err)
						}
						fds = append(fds, fd)
					}
					oob = unix.UnixRights(fds...)
					// Closed once sent: in flight they are the message's.
				}
				err := unix.Sendmsg(raw, m, oob, nil, 0)
				for _, fd := range parseRightsOf(oob) {
					unix.Close(fd)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			ev, err := c.Receive()
			if err == nil {
				t.Fatalf("accepted: %+v", ev)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not say malformed", err)
			}
			// Everything Receive got is closed.
			if n := openFDs(t); n != before {
				t.Errorf("%d descriptors open, %d before: received sockets leaked", n, before)
			}
		})
	}
}

// TestSendBounds refuses what the receiver would refuse.
func TestSendBounds(t *testing.T) {
	src, _ := pair(t)
	if err := src.SendState([]Item{{Kind: KindTCP, Data: make([]byte, MaxItemSize+1), FD: -1}}); !errors.Is(err, ErrMalformed) {
		t.Errorf("oversized item sent: %v", err)
	}
	if err := src.SendState([]Item{{Kind: 9, FD: -1}}); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown kind sent: %v", err)
	}
}

func TestDialNobody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Fatal("dialled nothing")
	}
	// A listener that never answers the HELLO.
	path := filepath.Join(t.TempDir(), "mute.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(StepTimeout + time.Second)
		}
	}()
	start := time.Now()
	if _, err := Dial(ctx, path); err == nil {
		t.Fatal("a mute source was accepted")
	}
	if d := time.Since(start); d > StepTimeout+2*time.Second {
		t.Errorf("Dial took %v", d)
	}
}

// FuzzDecode: any bytes decode to a bounded message or an error.
func FuzzDecode(f *testing.F) {
	f.Add(appendHeader(nil, msgHello, 0, 0))
	f.Add(rawState(Item{Kind: KindTCP, Pair: 3, Data: []byte("abc"), FD: 1}, Item{Kind: KindDgram, Data: nil, FD: -1}))
	f.Add(appendHeader(nil, msgEnd, 2, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			return
		}
		if m.withFD > len(m.items) || m.withFD > MaxFDsPerMessage || len(m.items) > MaxItemsPerMessage {
			t.Fatalf("%v: %d items, %d with sockets", m.typ, len(m.items), m.withFD)
		}
		k := 0
		for _, it := range m.items {
			if len(it.Data) > MaxItemSize || it.Kind == 0 || it.Kind >= numKinds {
				t.Fatalf("item %+v", it)
			}
			if it.FD >= 0 {
				if it.FD != k {
					t.Fatalf("socket index %d, want %d", it.FD, k)
				}
				k++
			}
		}
		// What decodes encodes back to the same bytes.
		if m.typ == msgState {
			items := append([]Item(nil), m.items...)
			re, err := encodeState(nil, items)
			if err != nil || !bytes.Equal(re, b) {
				t.Fatalf("re-encoding differs: %v", err)
			}
		}
	})
}

// parseRightsOf returns the descriptors in an SCM_RIGHTS buffer we built.
func parseRightsOf(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	return parseRights(oob)
}
