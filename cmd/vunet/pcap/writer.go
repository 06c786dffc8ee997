package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// File format constants (https://www.tcpdump.org/manpages/pcap-savefile.5.html).
const (
	magicNanoseconds  = 0xa1b23c4d
	versionMajor      = 2
	versionMinor      = 4
	linkTypeEthernet  = 1
	fileHeaderLen     = 24
	recordHeaderLen   = 16
	defaultSnapLen    = 65535 + 14 + 4 // a 64 KiB GSO frame with its Ethernet header
	defaultRingBytes  = 4 << 20
	defaultDrainEvery = 20 * time.Millisecond
)

// Config sizes a Writer. Zero fields take the defaults.
type Config struct {
	// Pairs is the number of producers: one per queue pair, each used by
	// a single goroutine at a time (default 1).
	Pairs int
	// RingBytes is each producer's ring size (default 4 MiB).
	RingBytes int
	// SnapLen is the most bytes kept of one frame (default 65553).
	SnapLen int
	// DrainEvery is how often the rings are written out (default 20ms).
	DrainEvery time.Duration
}

// Writer is an open capture.
type Writer struct {
	cfg   Config
	out   *bufio.Writer
	close func() error
	rings []ring

	// Written counts frames written to the file; Dropped frames that found
	// their ring full.
	Written, Dropped atomic.Uint64

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
	err      error // first write error, reported by Close
}

// Create creates (truncates) the file at path and starts capturing.
func Create(path string, cfg Config) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, fmt.Errorf("pcap: %w", err)
	}
	w, err := newWriter(f, f.Close, cfg)
	if err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// NewWriter captures to out; Close does not close it.
func NewWriter(out io.Writer, cfg Config) (*Writer, error) {
	return newWriter(out, func() error { return nil }, cfg)
}

func newWriter(out io.Writer, closeFn func() error, cfg Config) (*Writer, error) {
	if cfg.Pairs <= 0 {
		cfg.Pairs = 1
	}
	if cfg.SnapLen <= 0 {
		cfg.SnapLen = defaultSnapLen
	}
	if cfg.RingBytes <= 0 {
		cfg.RingBytes = defaultRingBytes
	}
	if cfg.RingBytes < 2*(recordHeaderLen+cfg.SnapLen) {
		// A ring must hold a full-size frame even after a wrap-around.
		cfg.RingBytes = 2 * (recordHeaderLen + cfg.SnapLen)
	}
	if cfg.DrainEvery <= 0 {
		cfg.DrainEvery = defaultDrainEvery
	}
	w := &Writer{
		cfg:   cfg,
		out:   bufio.NewWriterSize(out, 256<<10),
		close: closeFn,
		rings: make([]ring, cfg.Pairs),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	for i := range w.rings {
		w.rings[i].buf = make([]byte, cfg.RingBytes)
	}
	var hdr [fileHeaderLen]byte
	binary.LittleEndian.PutUint32(hdr[0:], magicNanoseconds)
	binary.LittleEndian.PutUint16(hdr[4:], versionMajor)
	binary.LittleEndian.PutUint16(hdr[6:], versionMinor)
	binary.LittleEndian.PutUint32(hdr[16:], uint32(cfg.SnapLen))
	binary.LittleEndian.PutUint32(hdr[20:], linkTypeEthernet)
	if _, err := w.out.Write(hdr[:]); err != nil {
		return nil, fmt.Errorf("pcap: header: %w", err)
	}
	if err := w.out.Flush(); err != nil {
		return nil, fmt.Errorf("pcap: header: %w", err)
	}
	go w.drainLoop()
	return w, nil
}

// Frame captures one frame of n bytes, the bytes of iov after the first
// skip (the virtio-net header). It copies at most SnapLen bytes into pair's
// ring and returns at once; it never blocks and never allocates. Only one
// goroutine may call it for a given pair at a time. Frames of an unknown
// pair, and frames that do not fit, are counted as dropped.
func (w *Writer) Frame(pair int, iov [][]byte, skip, n int) {
	if pair < 0 || pair >= len(w.rings) || n <= 0 {
		w.Dropped.Add(1)
		return
	}
	incl := min(n, w.cfg.SnapLen)
	if !w.rings[pair].put(time.Now().UnixNano(), iov, skip, incl, n) {
		w.Dropped.Add(1)
	}
}

// Close writes out what the rings hold and closes the file. Frames must not
// be captured after Close starts.
func (w *Writer) Close() error {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
	if err := w.out.Flush(); err != nil && w.err == nil {
		w.err = err
	}
	if err := w.close(); err != nil && w.err == nil {
		w.err = err
	}
	return w.err
}

func (w *Writer) drainLoop() {
	defer close(w.done)
	t := time.NewTicker(w.cfg.DrainEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			w.drain()
			return
		case <-t.C:
			w.drain()
			if err := w.out.Flush(); err != nil && w.err == nil {
				w.err = err
			}
		}
	}
}

// drain writes every complete record of every ring. Records of one pair
// stay in order; pairs are interleaved ring by ring, so timestamps across
// pairs may step back slightly (readers sort by timestamp if they care).
func (w *Writer) drain() {
	var hdr [recordHeaderLen]byte
	for i := range w.rings {
		r := &w.rings[i]
		r.consume(func(ts int64, incl, orig uint32, data []byte) {
			binary.LittleEndian.PutUint32(hdr[0:], uint32(ts/1e9))
			binary.LittleEndian.PutUint32(hdr[4:], uint32(ts%1e9))
			binary.LittleEndian.PutUint32(hdr[8:], incl)
			binary.LittleEndian.PutUint32(hdr[12:], orig)
			if _, err := w.out.Write(hdr[:]); err != nil {
				w.noteErr(err)
				return
			}
			w.out.Write(data) // bufio keeps the error for the next Flush
			w.Written.Add(1)
		})
	}
}

func (w *Writer) noteErr(err error) {
	if w.err == nil {
		w.err = errors.Join(errors.New("pcap: write"), err)
	}
}
