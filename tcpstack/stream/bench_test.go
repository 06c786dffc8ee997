package stream

import (
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/stats"
)

// readAll reads exactly n bytes from fd into buf (n <= len(buf) not
// required: it reads in pieces).
func readAll(b *testing.B, fd int, buf []byte, n int) {
	for n > 0 {
		k, err := unix.Read(fd, buf[:min(n, len(buf))])
		if err != nil || k == 0 {
			b.Fatalf("read: %d, %v", k, err)
		}
		n -= k
	}
}

// BenchmarkWriter is the stream's cost per batch of frames to the guest:
// 64 frames reserved, built and committed into the send buffer, written
// with one sendmsg (the peer's reads are in the timing too).
func BenchmarkWriter(b *testing.B) {
	for _, size := range []int{64, 1514, 65534} {
		b.Run(sizeName(size), func(b *testing.B) {
			a, peer := socketPair(b)
			var w Writer
			w.Init(a, SendBufSize, new(stats.Queue), testLog)
			frame := make([]byte, size)
			sink := make([]byte, 1<<20)
			per := 64
			if size > 60000 {
				per = 8 // the socket's buffer holds no more at once here
			}
			b.ReportAllocs()
			b.SetBytes(int64(size * per))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w.BeginIteration()
				for j := 0; j < per; j++ {
					hdr, pay, s := w.Reserve(54, size-54)
					if s != guestring.OK {
						b.Fatalf("reserve: %v", s)
					}
					copy(hdr, frame)
					copy(pay[0], frame[54:])
					w.Commit(size-54, nil)
				}
				w.Publish()
				left := per * (size + LenSize)
				for w.Queued() > 0 {
					// The socket took part: read what it holds, let the rest go.
					k, err := unix.Read(peer, sink)
					if err != nil {
						b.Fatal(err)
					}
					left -= k
					w.Writable()
				}
				readAll(b, peer, sink, left)
			}
		})
	}
}

// BenchmarkReader is the cost of taking 64 frames off the socket: one
// recv (the peer's write is in the timing too) and 64 Next.
func BenchmarkReader(b *testing.B) {
	for _, size := range []int{64, 1514} {
		b.Run(sizeName(size), func(b *testing.B) {
			a, peer := socketPair(b)
			var wire []byte
			for j := 0; j < 64; j++ {
				wire = append(wire, framed(make([]byte, size))...)
			}
			var r Reader
			r.Init(ReadBufSize)
			b.ReportAllocs()
			b.SetBytes(int64(size * 64))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := unix.Write(peer, wire); err != nil {
					b.Fatal(err)
				}
				got := 0
				for got < 64 {
					if _, err := r.Read(a); err != nil {
						b.Fatal(err)
					}
					for {
						f, err := r.Next()
						if err != nil {
							b.Fatal(err)
						}
						if f == nil {
							break
						}
						got++
					}
				}
			}
		})
	}
}

func sizeName(n int) string {
	switch n {
	case 64:
		return "64"
	case 1514:
		return "1514"
	}
	return "64k"
}
