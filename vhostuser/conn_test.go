package vhostuser

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

func codecPair(t *testing.T) (*net.UnixConn, *Conn) {
	t.Helper()
	a, b := socketPair(t)
	c, err := NewConn(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); c.Close() })
	return a, c
}

func rawMsg(req Request, flags, size uint32, payload []byte) []byte {
	b := make([]byte, HeaderSize)
	Header{Request: req, Flags: flags, Size: size}.Encode(b)
	return append(b, payload...)
}

func TestReadMessageWithFDs(t *testing.T) {
	a, c := codecPair(t)
	before := openFDs(t)
	fe := &frontend{t: t, c: a}
	fe.send(ReqSetVringCall, 0, u64(3), eventfd(t))
	fe.send(ReqGetFeatures, FlagNeedReply, nil)
	var m Message
	if err := c.ReadMessage(&m); err != nil {
		t.Fatal(err)
	}
	if m.Header != (Header{Request: ReqSetVringCall, Flags: FlagVersion1, Size: 8}) || !bytes.Equal(m.Payload, u64(3)) || len(m.FDs) != 1 {
		t.Fatalf("message %+v payload %x fds %v", m.Header, m.Payload, m.FDs)
	}
	var st unix.Stat_t
	if err := unix.Fstat(m.FDs[0], &st); err != nil {
		t.Fatalf("received fd unusable: %v", err)
	}
	flags, _ := unix.FcntlInt(uintptr(m.FDs[0]), unix.F_GETFD, 0)
	if flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("received fd without FD_CLOEXEC")
	}
	m.closeFDs()
	if err := c.ReadMessage(&m); err != nil {
		t.Fatal(err)
	}
	if m.Header.Request != ReqGetFeatures || m.Header.Flags != FlagVersion1|FlagNeedReply || len(m.Payload) != 0 || len(m.FDs) != 0 {
		t.Fatalf("second message %+v fds %v", m.Header, m.FDs)
	}
	if n := openFDs(t); n > before {
		t.Fatalf("fds %d, before %d", n, before)
	}
	// Front-end closes between messages: EOF.
	a.Close()
	if err := c.ReadMessage(&m); err != io.EOF {
		t.Fatalf("want io.EOF, got %v", err)
	}
}

func TestReadMessageTooManyFDs(t *testing.T) {
	a, c := codecPair(t)
	before := openFDs(t)
	fds := make([]int, MaxFDs+1)
	for i := range fds {
		fds[i] = eventfd(t)
	}
	(&frontend{t: t, c: a}).send(ReqSetMemTable, 0, table(), fds...)
	var m Message
	if err := c.ReadMessage(&m); !errors.Is(err, ErrFDCount) {
		t.Fatalf("want ErrFDCount, got %v", err)
	}
	if n := openFDs(t); n > before {
		t.Fatalf("fds leaked: %d, before %d", n, before)
	}
}

func TestReadMessageErrors(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		want error // nil: any non-EOF error
	}{
		{"partial header", []byte{1, 0, 0, 0, 1}, io.ErrUnexpectedEOF},
		{"version 0", rawMsg(ReqGetFeatures, 0, 0, nil), ErrMalformed},
		{"version 2", rawMsg(ReqGetFeatures, 2, 0, nil), ErrMalformed},
		{"reply flag", rawMsg(ReqGetFeatures, FlagVersion1|FlagReply, 0, nil), ErrMalformed},
		{"unknown flag", rawMsg(ReqGetFeatures, FlagVersion1|0x10, 0, nil), ErrMalformed},
		{"oversized", rawMsg(ReqSetMemTable, FlagVersion1, MaxPayloadSize+1, nil), ErrMalformed},
		{"huge size", rawMsg(ReqSetMemTable, FlagVersion1, 0xffffffff, nil), ErrMalformed},
		{"truncated payload", rawMsg(ReqSetVringAddr, FlagVersion1, 40, make([]byte, 10)), io.ErrUnexpectedEOF},
		{"garbage", bytes.Repeat([]byte{0xff}, 64), ErrMalformed},
		{"zeros", make([]byte, HeaderSize), ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, c := codecPair(t)
			if _, err := a.Write(tc.data); err != nil {
				t.Fatal(err)
			}
			a.CloseWrite()
			var m Message
			err := c.ReadMessage(&m)
			if err == nil || err == io.EOF {
				t.Fatalf("got %v", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestWriteReply(t *testing.T) {
	a, c := codecPair(t)
	if err := c.WriteReply(ReqGetVringBase, state(1, 77)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, HeaderSize+8)
	if _, err := io.ReadFull(a, got); err != nil {
		t.Fatal(err)
	}
	want := rawMsg(ReqGetVringBase, FlagVersion1|FlagReply, 8, state(1, 77))
	if !bytes.Equal(got, want) {
		t.Fatalf("reply % x, want % x", got, want)
	}
}

func TestValidateMessage(t *testing.T) {
	cases := []struct {
		req     Request
		payload []byte
		fds     int
		ok      bool
	}{
		{ReqGetFeatures, nil, 0, true},
		{ReqGetFeatures, nil, 1, false},
		{ReqSetFeatures, u64(0), 0, true},
		{ReqSetFeatures, u64(0)[:7], 0, false},
		{ReqSetVringKick, u64(0), 1, true},
		{ReqSetVringKick, u64(0), 0, false},
		{ReqSetVringKick, u64(VringNoFDFlag), 0, true},
		{ReqSetVringKick, u64(VringNoFDFlag), 1, false},
		{ReqSetMemTable, table(MemRegion{}, MemRegion{}), 2, true},
		{ReqSetMemTable, table(MemRegion{}, MemRegion{}), 1, false},
		{ReqSetMemTable, append(table(MemRegion{}), make([]byte, 7*32)...), 1, true}, // full 8-slot array
		{ReqSetMemTable, append(table(MemRegion{}), make([]byte, 32)...), 1, false},  // neither form
		{ReqSetMemTable, table()[:4], 0, false},
		{ReqAddMemReg, memReg(MemRegion{}), 1, true},
		{ReqAddMemReg, memReg(MemRegion{}), 2, false},
		{ReqRemMemReg, memReg(MemRegion{}), 0, true},
		{ReqRemMemReg, memReg(MemRegion{}), 1, true},
		{ReqRemMemReg, memReg(MemRegion{}), 2, false},
		{ReqSetVringAddr, addr(VringAddr{}), 0, true},
		{ReqSetVringAddr, addr(VringAddr{})[:32], 0, false},
		{ReqGetVringBase, state(0, 0), 0, true},
		{ReqGetVringBase, nil, 0, false},
		{ReqSetLogFD, nil, 1, true},        // unsupported: any shape, fds closed later
		{Request(1000), nil, MaxFDs, true}, // unknown: same
		{Request(1000), nil, MaxFDs + 1, false},
	}
	for _, tc := range cases {
		h := Header{Request: tc.req, Flags: FlagVersion1, Size: uint32(len(tc.payload))}
		err := ValidateMessage(h, tc.payload, tc.fds)
		if (err == nil) != tc.ok {
			t.Errorf("%v payload %d bytes, %d fds: err %v, want ok=%v", tc.req, len(tc.payload), tc.fds, err, tc.ok)
		}
	}
	if err := ValidateMessage(Header{Request: ReqSetFeatures, Size: 9}, u64(0), 0); !errors.Is(err, ErrTruncated) {
		t.Errorf("size mismatch: %v", err)
	}
}

func TestDecodeMessage(t *testing.T) {
	b := append(rawMsg(ReqSetVringNum, FlagVersion1, 8, state(1, 256)), rawMsg(ReqGetFeatures, FlagVersion1, 0, nil)...)
	h, p, rest, err := DecodeMessage(b)
	if err != nil || h.Request != ReqSetVringNum || !bytes.Equal(p, state(1, 256)) || len(rest) != HeaderSize {
		t.Fatalf("%+v %x %d %v", h, p, len(rest), err)
	}
	if _, _, _, err := DecodeMessage(rest[:5]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short header: %v", err)
	}
	if _, _, _, err := DecodeMessage(rawMsg(ReqSetVringNum, FlagVersion1, 8, nil)); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short payload: %v", err)
	}
}

func TestPayloadRoundTrips(t *testing.T) {
	a := VringAddr{Index: 3, Flags: 1, Desc: 0x1000, Used: 0x2000, Avail: 0x3000, Log: 0x4000}
	got, err := DecodeVringAddr(a.Encode(nil))
	if err != nil || got != a {
		t.Fatalf("addr %+v %v", got, err)
	}
	// Field order on the wire: index, flags, desc, used, avail, log.
	wire := a.Encode(nil)
	if wire[8] != 0 || wire[9] != 0x10 || wire[17] != 0x20 || wire[25] != 0x30 || wire[33] != 0x40 {
		t.Fatalf("addr wire % x", wire)
	}
	s := VringState{Index: 1, Num: 0xabcd}
	if got, err := DecodeVringState(s.Encode(nil)); err != nil || got != s {
		t.Fatalf("state %+v %v", got, err)
	}
	r := MemRegion{GuestAddr: 1, Size: 2, UserAddr: 3, MmapOffset: 4}
	if got, err := DecodeMemRegMsg(EncodeMemRegMsg(nil, r)); err != nil || got != r {
		t.Fatalf("memreg %+v %v", got, err)
	}
	if got := EncodeMemRegMsg(nil, r); len(got) != 40 || got[8] != 1 || got[16] != 2 {
		t.Fatalf("memreg wire % x", got)
	}
	rs, err := DecodeMemTable(EncodeMemTable(nil, []MemRegion{r, r}))
	if err != nil || len(rs) != 2 || rs[1] != r {
		t.Fatalf("table %+v %v", rs, err)
	}
	if v, err := DecodeU64(EncodeU64(nil, 0x0102030405060708)); err != nil || v != 0x0102030405060708 {
		t.Fatalf("u64 %x %v", v, err)
	}
}

func TestRequestString(t *testing.T) {
	for r, want := range map[Request]string{
		ReqGetFeatures: "GET_FEATURES", ReqSetVringAddr: "SET_VRING_ADDR", ReqAddMemReg: "ADD_MEM_REG",
		ReqGetStatus: "GET_STATUS", ReqCheckDeviceState: "CHECK_DEVICE_STATE", Request(44): "UNKNOWN(44)",
	} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", uint32(r), r.String(), want)
		}
	}
	for r := Request(0); r < NumRequests; r++ {
		if requestNames[r] == "" {
			t.Errorf("request %d has no name", r)
		}
	}
	for r := ErrorReason(0); r < NumErrorReasons; r++ {
		if r.String() == "unknown" || r.String() == "" {
			t.Errorf("reason %d has no name", r)
		}
	}
}
