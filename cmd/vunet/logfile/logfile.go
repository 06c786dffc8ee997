// Package logfile is --log-file with passt's --log-size: a log file that
// never grows past a size, made room in by cutting its oldest lines inside
// the open file. The sandboxed daemon can open no path after start-up, so
// rotating by renaming and reopening is not possible; the cut is done on
// the open descriptor.
package logfile

import (
	"bytes"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// DefaultMax is passt's --log-size default, 1 MiB.
const DefaultMax = 1 << 20

// MinMax is the smallest cap accepted: room for a few lines and the
// marker.
const MinMax = 4096

// keepRatio is how much of the cap a cut leaves (in quarters): cutting a
// quarter at a time keeps most history while cuts stay infrequent (passt
// cuts about 30%).
const keepQuarters = 3

// File is a log file capped at a size. When a write would take it past
// the cap, the oldest whole lines are removed so that the rest, a marker
// line and the write fit in three quarters of it; the marker (first line)
// says how many bytes went. Writes are serialised. A file that is not a
// regular file (a pipe, a terminal, /dev/null) is written to without a
// cap.
type File struct {
	mu sync.Mutex
	f  *os.File
	// rw is a second description of the same file, not in append mode,
	// for the cut's positioned writes: f stays in append mode throughout,
	// so that a write through a duplicate of it (the daemon's standard
	// error) never lands past the end of a file the cut just shortened.
	// nil: it could not be opened, and the cut leaves f's append mode for
	// its moves (as passt does).
	rw     *os.File
	max    int64
	size   int64 // bytes in the file, as far as our writes tell
	capped bool
	marker func(removed int64) []byte
	buf    []byte
}

// Open opens path for appending, creating it with mode 0640. marker
// formats the line that replaces the cut lines; nil uses a plain one.
func Open(path string, max int64, marker func(removed int64) []byte) (*File, error) {
	if max < MinMax {
		return nil, fmt.Errorf("log size %d: want at least %d bytes", max, MinMax)
	}
	if marker == nil {
		marker = func(removed int64) []byte {
			return fmt.Appendf(nil, "[log cut: %d bytes of older lines removed]\n", removed)
		}
	}
	// Read access is for moving the kept lines; append mode keeps every
	// write at the end even if someone else truncates the file.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		// Write-only things (a pipe given as /dev/stderr) cannot be
		// reopened for reading; they get no cap anyway.
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640); err != nil {
			return nil, err
		}
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	lf := &File{f: f, max: max, size: st.Size(), capped: st.Mode().IsRegular(), marker: marker}
	if lf.capped {
		lf.rw = sameFile(path, st)
	}
	return lf, nil
}

// sameFile opens path again for reading and writing, without append mode,
// if it is still the file st describes; nil if not.
func sameFile(path string, st os.FileInfo) *os.File {
	rw, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	if st2, err := rw.Stat(); err != nil || !os.SameFile(st, st2) {
		rw.Close()
		return nil
	}
	return rw
}

// Write appends p, first cutting old lines if p would not fit.
func (l *File) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.capped {
		return l.f.Write(p)
	}
	n := len(p)
	if l.size+int64(len(p)) > l.max {
		// Someone may have emptied the file meanwhile (logrotate's
		// copytruncate): believe the file, not the count.
		if st, err := l.f.Stat(); err == nil {
			l.size = st.Size()
		}
	}
	if l.size+int64(len(p)) > l.max {
		if err := l.cut(int64(len(p))); err != nil {
			return 0, err
		}
		if room := max(l.max-l.size, 0); int64(len(p)) > room {
			p = p[:room] // one record larger than the cap
		}
	}
	w, err := l.f.Write(p)
	l.size += int64(w)
	if err == nil && w < n {
		return n, nil // cut to the cap: the caller's line is consumed
	}
	return w, err
}

// cut removes the oldest lines so that the rest, the marker and need bytes
// fit in keepQuarters/4 of the cap, and writes the marker first.
func (l *File) cut(need int64) error {
	var fd int
	if l.rw != nil {
		fd = int(l.rw.Fd())
	} else {
		// pwrite ignores the offset on an append-mode file: leave
		// append mode for the move.
		fd = int(l.f.Fd())
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err != nil {
			return fmt.Errorf("log cut: %w", err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^unix.O_APPEND); err != nil {
			return fmt.Errorf("log cut: %w", err)
		}
		defer unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	}

	keep := l.max*keepQuarters/4 - need
	// The marker's length depends on the number it prints: size it with
	// the largest possible count.
	keep -= int64(len(l.marker(l.size)))
	keep = max(keep, 0)
	from, err := l.lineStart(max(l.size-keep, 0))
	if err != nil {
		return err
	}
	m := l.marker(from)
	if err := pwriteAll(fd, m, 0); err != nil {
		return fmt.Errorf("log cut: %w", err)
	}
	if l.buf == nil {
		l.buf = make([]byte, 32<<10)
	}
	// Move [from, size) down to just after the marker; the destination
	// is always before the source, so a forward copy is safe.
	dst := int64(len(m))
	for src := from; src < l.size; {
		// Up to the size the cut started from: an uncapped writer may
		// be appending meanwhile, and what it adds now goes with the
		// truncation rather than pushing the kept lines past the cap.
		n, err := unix.Pread(fd, l.buf[:min(int64(len(l.buf)), l.size-src)], src)
		if err != nil {
			return fmt.Errorf("log cut: %w", err)
		}
		if n == 0 {
			break
		}
		if err := pwriteAll(fd, l.buf[:n], dst); err != nil {
			return fmt.Errorf("log cut: %w", err)
		}
		src += int64(n)
		dst += int64(n)
	}
	if err := unix.Ftruncate(fd, dst); err != nil {
		return fmt.Errorf("log cut: %w", err)
	}
	l.size = dst
	return nil
}

// lineStart returns the offset of the first line that starts at or after
// off (the file's end if none does).
func (l *File) lineStart(off int64) (int64, error) {
	if off == 0 {
		return 0, nil
	}
	var b [4096]byte
	fd := int(l.f.Fd())
	// A line starts at off if the byte before it ends one.
	for pos := off - 1; pos < l.size; {
		n, err := unix.Pread(fd, b[:], pos)
		if err != nil {
			return 0, fmt.Errorf("log cut: %w", err)
		}
		if i := bytes.IndexByte(b[:n], '\n'); i >= 0 {
			return pos + int64(i) + 1, nil
		}
		if n == 0 {
			break
		}
		pos += int64(n)
	}
	return l.size, nil
}

// pwriteAll writes all of b at off.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// File is the open file, for what must write to it without the cap (a
// daemon's standard error, where only a Go panic would land).
func (l *File) File() *os.File { return l.f }

// Close closes the file.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rw != nil {
		l.rw.Close()
	}
	return l.f.Close()
}
