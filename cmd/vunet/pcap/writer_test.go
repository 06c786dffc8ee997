package pcap

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type record struct {
	ts         time.Time
	incl, orig uint32
	data       []byte
}

// readPCAP parses a capture the way libpcap does, checking the header.
func readPCAP(t *testing.T, b []byte) (snap uint32, recs []record) {
	t.Helper()
	if len(b) < fileHeaderLen {
		t.Fatalf("file of %d bytes", len(b))
	}
	le := binary.LittleEndian
	if le.Uint32(b) != magicNanoseconds || le.Uint16(b[4:]) != 2 || le.Uint16(b[6:]) != 4 || le.Uint32(b[20:]) != linkTypeEthernet {
		t.Fatalf("bad file header % x", b[:fileHeaderLen])
	}
	snap = le.Uint32(b[16:])
	b = b[fileHeaderLen:]
	for len(b) > 0 {
		if len(b) < recordHeaderLen {
			t.Fatalf("truncated record header (%d bytes)", len(b))
		}
		r := record{ts: time.Unix(int64(le.Uint32(b)), int64(le.Uint32(b[4:]))), incl: le.Uint32(b[8:]), orig: le.Uint32(b[12:])}
		if le.Uint32(b[4:]) >= 1e9 || r.incl > snap || r.incl > r.orig || len(b) < recordHeaderLen+int(r.incl) {
			t.Fatalf("bad record header % x (snap %d, %d bytes left)", b[:recordHeaderLen], snap, len(b))
		}
		r.data = b[recordHeaderLen : recordHeaderLen+r.incl]
		recs = append(recs, r)
		b = b[recordHeaderLen+r.incl:]
	}
	return snap, recs
}

func frame(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return b
}

func TestWriterRecords(t *testing.T) {
	var out bytes.Buffer
	w, err := NewWriter(&out, Config{Pairs: 2, SnapLen: 100, RingBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	hdr := make([]byte, 12) // virtio-net header, skipped
	f1 := frame(60, 1)
	// A frame split over descriptors, the header in the first one.
	w.Frame(0, [][]byte{hdr, f1[:20], f1[20:]}, 12, 60)
	// Header and frame start in one buffer.
	f2 := frame(80, 2)
	w.Frame(1, [][]byte{append(append([]byte{}, hdr...), f2[:50]...), f2[50:]}, 12, 80)
	// Longer than the snap length: truncated, original length kept.
	f3 := frame(300, 3)
	w.Frame(0, [][]byte{f3}, 0, 300)
	// Claims more bytes than the iovecs hold: recorded as captured.
	w.Frame(0, [][]byte{f1[:10]}, 0, 50)
	// Unknown pair and empty frame: dropped.
	w.Frame(2, [][]byte{f1}, 0, 60)
	w.Frame(0, nil, 0, 0)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	snap, recs := readPCAP(t, out.Bytes())
	if snap != 100 || len(recs) != 4 {
		t.Fatalf("snap %d, %d records", snap, len(recs))
	}
	// Pair 0's records in order, then pair 1's.
	want := []record{{incl: 60, orig: 60, data: f1}, {incl: 100, orig: 300, data: f3[:100]}, {incl: 10, orig: 50, data: f1[:10]}, {incl: 80, orig: 80, data: f2}}
	for i, r := range recs {
		if r.incl != want[i].incl || r.orig != want[i].orig || !bytes.Equal(r.data, want[i].data) {
			t.Errorf("record %d: incl %d orig %d data % x, want %d %d % x", i, r.incl, r.orig, r.data, want[i].incl, want[i].orig, want[i].data)
		}
		if r.ts.Before(before.Add(-time.Second)) || r.ts.After(time.Now()) {
			t.Errorf("record %d timestamp %v", i, r.ts)
		}
	}
	if w.Written.Load() != 4 || w.Dropped.Load() != 2 {
		t.Errorf("written %d dropped %d, want 4 and 2", w.Written.Load(), w.Dropped.Load())
	}
}

// TestRingFullDropsAndWraps fills a ring without draining (a long drain
// period), checks the overflow is dropped and counted, then that records
// keep their bytes across many wrap-arounds.
func TestRingFullDropsAndWraps(t *testing.T) {
	var out bytes.Buffer
	w, err := NewWriter(&out, Config{SnapLen: 200, RingBytes: 1000, DrainEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := frame(200, 7)
	n := 0
	for i := 0; i < 10; i++ {
		w.Frame(0, [][]byte{f}, 0, 200)
	}
	// 1000 bytes hold four 216-byte records (864); the rest are dropped.
	if d := w.Dropped.Load(); d != 6 {
		t.Fatalf("dropped %d, want 6", d)
	}
	n += 4
	// Drain by hand (the writer's goroutine sleeps) and write odd sizes
	// so records wrap at every offset.
	var sizes []int
	for i := 0; i < 500; i++ {
		size := 1 + (i*37)%200
		w.Frame(0, [][]byte{frame(size, byte(i))}, 0, size)
		sizes = append(sizes, size)
		if i%3 == 0 {
			w.drain()
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, recs := readPCAP(t, out.Bytes())
	got := recs[n:]
	if len(got)+int(w.Dropped.Load())-6 != len(sizes) {
		t.Fatalf("%d records + %d dropped, want %d frames", len(got), w.Dropped.Load()-6, len(sizes))
	}
	// Every record that made it is one of the frames, whole, in order.
	j := 0
	for _, r := range got {
		for j < len(sizes) && int(r.incl) != sizes[j] {
			j++
		}
		if j == len(sizes) || !bytes.Equal(r.data, frame(sizes[j], byte(j))) {
			t.Fatalf("record of %d bytes does not match frame %d", r.incl, j)
		}
		j++
	}
	if len(got) < len(sizes)/2 {
		t.Fatalf("only %d of %d frames captured", len(got), len(sizes))
	}
}

// TestConcurrentPairs runs one producer per pair against the drain
// goroutine (go test -race covers the ring's publication).
func TestConcurrentPairs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.pcap")
	w, err := Create(path, Config{Pairs: 4, RingBytes: 64 << 10, DrainEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	for p := 0; p < 4; p++ {
		go func(p int) {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 2000; i++ {
				f := frame(64+i%100, byte(p))
				f[0] = byte(p)
				binary.BigEndian.PutUint32(f[1:], uint32(i))
				w.Frame(p, [][]byte{f}, 0, len(f))
				if i%64 == 0 {
					time.Sleep(100 * time.Microsecond)
				}
			}
		}(p)
	}
	for p := 0; p < 4; p++ {
		<-done
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, recs := readPCAP(t, b)
	last := map[byte]int64{0: -1, 1: -1, 2: -1, 3: -1}
	for _, r := range recs {
		p, i := r.data[0], int64(binary.BigEndian.Uint32(r.data[1:]))
		if i <= last[p] {
			t.Fatalf("pair %d: frame %d after %d", p, i, last[p])
		}
		want := frame(64+int(i)%100, p)
		want[0] = p
		binary.BigEndian.PutUint32(want[1:], uint32(i))
		if !bytes.Equal(r.data, want) {
			t.Fatalf("pair %d frame %d corrupted", p, i)
		}
		last[p] = i
	}
	if uint64(len(recs))+w.Dropped.Load() != 8000 || uint64(len(recs)) != w.Written.Load() {
		t.Fatalf("%d records, %d written, %d dropped; want 8000 in all", len(recs), w.Written.Load(), w.Dropped.Load())
	}
}

// TestReadableByTools opens a capture of a real Ethernet/IPv4/UDP frame
// with tcpdump or tshark when one is installed.
func TestReadableByTools(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.pcap")
	w, err := Create(path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := []byte{
		0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55, 0x08, 0x00, // Ethernet
		0x45, 0, 0, 32, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 2, 15, 10, 0, 2, 2, // IPv4 (checksum not checked by readers)
		0x30, 0x39, 0x27, 0x0f, 0, 12, 0, 0, 'p', 'i', 'n', 'g', // UDP 12345 -> 9999
	}
	w.Frame(0, [][]byte{f}, 0, len(f))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	if p, err := exec.LookPath("tshark"); err == nil {
		cmd = exec.Command(p, "-r", path)
	} else if p, err := exec.LookPath("tcpdump"); err == nil {
		cmd = exec.Command(p, "-nn", "-r", path)
	} else {
		t.Skip("neither tshark nor tcpdump installed (apt-get install tshark or tcpdump)")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	s := string(out)
	if !strings.Contains(s, "10.0.2.15") || !strings.Contains(s, "10.0.2.2") || !strings.Contains(s, "UDP") || !strings.Contains(s, "9999") {
		t.Fatalf("%v did not decode the frame:\n%s", cmd.Args, s)
	}
}

func BenchmarkFrame(b *testing.B) {
	w, err := NewWriter(io.Discard, Config{DrainEvery: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	hdr := make([]byte, 12)
	f := frame(1514, 0)
	iov := [][]byte{hdr, f}
	b.ReportAllocs()
	b.SetBytes(int64(len(f)))
	for i := 0; i < b.N; i++ {
		w.Frame(0, iov, 12, len(f))
	}
}
