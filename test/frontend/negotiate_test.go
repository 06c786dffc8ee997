package frontend

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeBackend answers just enough of the protocol to let Negotiate run and
// records what it was sent.
type fakeBackend struct {
	conn      *net.UnixConn
	features  uint64
	protocol  uint64
	queues    uint64
	nack      Request // reply non-zero to NEED_REPLY on this request
	log       []string
	done      chan struct{}
	mu        sync.Mutex // the socket orders events, but the race detector cannot see that
	badFDs    []string
	vringAddr []VringAddr
}

// snapshot returns copies of what was recorded so far.
func (b *fakeBackend) snapshot() (log, badFDs []string, addrs []VringAddr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.log...), append([]string(nil), b.badFDs...), append([]VringAddr(nil), b.vringAddr...)
}

func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return mk(fds[0]), mk(fds[1])
}

func (b *fakeBackend) run() {
	defer close(b.done)
	for {
		hdr := make([]byte, 12)
		oob := make([]byte, 256)
		n, oobn, _, _, err := b.conn.ReadMsgUnix(hdr, oob)
		if err != nil || n != 12 {
			return
		}
		var fds []int
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				f, _ := unix.ParseUnixRights(&m)
				fds = append(fds, f...)
			}
		}
		req := Request(binary.LittleEndian.Uint32(hdr))
		flags := binary.LittleEndian.Uint32(hdr[4:])
		size := binary.LittleEndian.Uint32(hdr[8:])
		payload := make([]byte, size)
		if _, err := b.conn.Read(payload); size > 0 && err != nil {
			return
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		b.mu.Lock()
		entry := reqName(req)
		switch req {
		case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
			v := binary.LittleEndian.Uint64(payload)
			entry += fmt.Sprintf("(%d)", v&0xff)
			if (v&VringNoFD != 0) != (len(fds) == 0) {
				b.badFDs = append(b.badFDs, entry)
			}
		case ReqSetVringNum, ReqSetVringBase, ReqSetVringEnable:
			entry += fmt.Sprintf("(%d,%d)", binary.LittleEndian.Uint32(payload), binary.LittleEndian.Uint32(payload[4:]))
		case ReqSetVringAddr:
			entry += fmt.Sprintf("(%d)", binary.LittleEndian.Uint32(payload))
			b.vringAddr = append(b.vringAddr, VringAddr{
				Index: binary.LittleEndian.Uint32(payload), Desc: binary.LittleEndian.Uint64(payload[8:]),
				Used: binary.LittleEndian.Uint64(payload[16:]), Avail: binary.LittleEndian.Uint64(payload[24:]),
			})
		case ReqAddMemReg:
			if len(fds) != 1 {
				b.badFDs = append(b.badFDs, entry)
			}
		case ReqSetMemTable:
			if int(binary.LittleEndian.Uint32(payload)) != len(fds) || int(size) != 8+32*len(fds) {
				b.badFDs = append(b.badFDs, entry)
			}
		case ReqSetStatus:
			entry += fmt.Sprintf("(%#x)", binary.LittleEndian.Uint64(payload))
		}
		if flags&FlagNeedReply != 0 {
			entry += "!"
		}
		b.log = append(b.log, entry)
		b.mu.Unlock()
		var reply []byte
		switch req {
		case ReqGetFeatures:
			reply = PayloadU64(b.features)
		case ReqGetProtocolFeatures:
			reply = PayloadU64(b.protocol)
		case ReqGetQueueNum:
			reply = PayloadU64(b.queues)
		case ReqGetMaxMemSlots:
			reply = PayloadU64(32)
		case ReqGetStatus:
			reply = PayloadU64(0)
		case ReqGetVringBase:
			reply = PayloadVringState(binary.LittleEndian.Uint32(payload), 77)
		default:
			if flags&FlagNeedReply != 0 {
				st := uint64(0)
				if req == b.nack {
					st = 1
				}
				reply = PayloadU64(st)
			}
		}
		if reply != nil {
			h := EncodeHeader(req, FlagVersion|FlagReply, uint32(len(reply)))
			if _, err := b.conn.Write(append(h, reply...)); err != nil {
				return
			}
		}
	}
}

func reqName(r Request) string {
	names := map[Request]string{
		ReqGetFeatures: "GET_FEATURES", ReqSetFeatures: "SET_FEATURES", ReqSetOwner: "SET_OWNER",
		ReqSetMemTable: "SET_MEM_TABLE", ReqSetVringNum: "NUM", ReqSetVringAddr: "ADDR",
		ReqSetVringBase: "BASE", ReqGetVringBase: "GET_VRING_BASE", ReqSetVringKick: "KICK",
		ReqSetVringCall: "CALL", ReqSetVringErr: "ERR", ReqGetProtocolFeatures: "GET_PROTO",
		ReqSetProtocolFeatures: "SET_PROTO", ReqGetQueueNum: "GET_QUEUE_NUM", ReqSetVringEnable: "ENABLE",
		ReqNetSetMTU: "MTU", ReqGetMaxMemSlots: "GET_MAX_MEM_SLOTS", ReqAddMemReg: "ADD_MEM_REG",
		ReqSetStatus: "SET_STATUS", ReqGetStatus: "GET_STATUS",
	}
	if n, ok := names[r]; ok {
		return n
	}
	return fmt.Sprint(int(r))
}

func startFake(t *testing.T, features, protocol uint64) (*Frontend, *fakeBackend) {
	return startFakeNack(t, features, protocol, 0)
}

// startFakeNack starts a fake that refuses NEED_REPLY requests of type nack.
func startFakeNack(t *testing.T, features, protocol uint64, nack Request) (*Frontend, *fakeBackend) {
	a, b := socketPair(t)
	fb := &fakeBackend{conn: b, features: features, protocol: protocol, queues: 4, nack: nack, done: make(chan struct{})}
	go fb.run()
	f := New(a)
	t.Cleanup(func() { f.Close(); <-fb.done; b.Close() })
	return f, fb
}

const allFeatures = 1<<FeatVersion1 | 1<<FeatMrgRxbuf | 1<<FeatEventIdx | 1<<FeatIndirectDesc |
	1<<FeatMQ | 1<<FeatMTU | 1<<FeatProtocolFeatures | 1<<FeatCSUM | 1<<FeatRingPacked

const allProtocol = 1<<ProtoMQ | 1<<ProtoReplyAck | 1<<ProtoMTU | 1<<ProtoConfigureMemSlots |
	1<<ProtoStatus | 1<<ProtoRARP

func TestNegotiateQEMUOrder(t *testing.T) {
	f, fb := startFake(t, allFeatures, allProtocol)
	if err := f.Negotiate(Options{Layout: LayoutPCHole, MTU: 1500, RingSize: 64}); err != nil {
		t.Fatal(err)
	}
	want := "GET_FEATURES GET_PROTO SET_PROTO GET_QUEUE_NUM GET_MAX_MEM_SLOTS SET_OWNER GET_FEATURES " +
		"CALL(0) ERR(0) CALL(1) ERR(1) ENABLE(0,1) ENABLE(1,1) MTU! SET_FEATURES GET_STATUS SET_STATUS(0xb) " +
		"ADD_MEM_REG! ADD_MEM_REG! NUM(0,64) BASE(0,0) ADDR(0) KICK(0) CALL(0) NUM(1,64) BASE(1,0) ADDR(1) KICK(1) CALL(1) " +
		"ENABLE(0,1) ENABLE(1,1) SET_STATUS(0xf) GET_FEATURES"
	log, badFDs, addrs := fb.snapshot()
	if got := strings.Join(log, " "); got != want {
		t.Fatalf("order:\n got %s\nwant %s", got, want)
	}
	if len(badFDs) != 0 {
		t.Fatalf("fd count wrong on %v", badFDs)
	}
	if f.Features != allFeatures&DefaultFeatureMask {
		t.Fatalf("acked %#x: must drop offers outside the mask (CSUM, RING_PACKED)", f.Features)
	}
	// Ring addresses are this process's addresses of the rings.
	for _, a := range addrs {
		r := f.Rings()[a.Index]
		dg, ag, ug := r.GPAs()
		for _, c := range [][2]uint64{{dg, a.Desc}, {ag, a.Avail}, {ug, a.Used}} {
			ua, _ := f.Mem.UserAddr(c[0])
			if ua != c[1] {
				t.Fatalf("ring %d: user addr %#x, want %#x", a.Index, c[1], ua)
			}
		}
	}
	bases, err := f.Stop()
	if err != nil || len(bases) != 2 || bases[0] != 77 {
		t.Fatalf("stop: %v %v", bases, err)
	}
}

func TestNegotiateQEMUMultiQueueRepeatsPerPair(t *testing.T) {
	f, fb := startFake(t, allFeatures, allProtocol&^(1<<ProtoStatus))
	if err := f.Negotiate(Options{QueuePairs: 2, MemTable: true, EnablePairs: 1, NoSync: true, AckAll: true}); err != nil {
		t.Fatal(err)
	}
	log, _, _ := fb.snapshot()
	count := map[string]int{}
	for _, e := range log {
		count[e]++
	}
	if count["GET_FEATURES"] != 4 || count["SET_FEATURES!"] != 2 || count["SET_MEM_TABLE!"] != 2 || count["SET_OWNER!"] != 1 {
		t.Fatalf("per-pair repetition wrong: %v", count)
	}
	if count["ENABLE(2,0)!"] != 2 || count["ENABLE(3,0)!"] != 2 || count["ENABLE(0,1)!"] != 2 {
		t.Fatalf("enable states wrong: %v", log)
	}
}

func TestNegotiateDPDKOrder(t *testing.T) {
	f, fb := startFake(t, allFeatures, allProtocol)
	if err := f.Negotiate(Options{Order: OrderDPDK, RingSize: 16}); err != nil {
		t.Fatal(err)
	}
	want := "SET_OWNER GET_FEATURES GET_PROTO SET_PROTO GET_QUEUE_NUM SET_FEATURES SET_MEM_TABLE CALL(0) CALL(1) " +
		"NUM(0,16) BASE(0,0) ADDR(0) KICK(0) NUM(1,16) BASE(1,0) ADDR(1) KICK(1) ENABLE(0,1) ENABLE(1,1) " +
		"ENABLE(0,0) ENABLE(1,0) SET_MEM_TABLE ENABLE(0,1) ENABLE(1,1) GET_FEATURES"
	log, _, _ := fb.snapshot()
	if got := strings.Join(log, " "); got != want {
		t.Fatalf("order:\n got %s\nwant %s", got, want)
	}
}

func TestNegotiateFailsWithoutProtocolFeatures(t *testing.T) {
	f, _ := startFake(t, allFeatures&^(1<<FeatProtocolFeatures), 0)
	if err := f.Negotiate(Options{}); err == nil {
		t.Fatal("negotiated with a back-end lacking PROTOCOL_FEATURES")
	}
}

func TestReplyAckNack(t *testing.T) {
	f, _ := startFakeNack(t, allFeatures, allProtocol, ReqAddMemReg)
	err := f.Negotiate(Options{})
	var nack *NackError
	if !asNack(err, &nack) || nack.Request != ReqAddMemReg || nack.Status != 1 {
		t.Fatalf("err %v", err)
	}
}

func asNack(err error, target **NackError) bool {
	for err != nil {
		if n, ok := err.(*NackError); ok {
			*target = n
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

func TestRecvRejectsOversizedReply(t *testing.T) {
	a, b := socketPair(t)
	defer a.Close()
	defer b.Close()
	c := NewConn(a)
	go b.Write(EncodeHeader(ReqGetFeatures, FlagVersion|FlagReply, MaxReplyPayload+1))
	if _, err := c.Recv(); err == nil {
		t.Fatal("oversized reply accepted")
	}
}

func TestRecvReportsClose(t *testing.T) {
	a, b := socketPair(t)
	defer a.Close()
	b.Close()
	if _, err := NewConn(a).Recv(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("err %v", err)
	}
}
