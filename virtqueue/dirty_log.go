package virtqueue

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Dirty-page logging for live migration (vhost-user "Migration"): while the
// front-end migrates the guest, every write the back-end makes into guest
// memory must be marked in a bitmap the front-end shares with us, one bit
// per DirtyLogPageSize bytes of guest-physical address space, so that it
// copies those pages again. The front-end reads and clears the bitmap
// concurrently (QEMU exchanges whole words atomically), so bits are only
// ever set, with atomic ORs, never written plainly.

// DirtyLogPageSize is VHOST_LOG_PAGE: the guest-physical bytes one log bit
// covers.
const DirtyLogPageSize = 0x1000

// MaxDirtyLogSize bounds the log a front-end may hand us, in bytes. At one
// bit per 4 KiB page it covers 8 TiB of guest-physical address space (QEMU
// sizes the log to the highest guest address it must cover), and it is
// only address space: the pages are the front-end's file, touched one word
// at a time.
const MaxDirtyLogSize = 256 << 20

// DirtyLog is the front-end's dirty-page bitmap (SET_LOG_BASE). Mark is
// safe for concurrent use by any number of queues; Unmap must wait until no
// queue built with the log runs any more.
type DirtyLog struct {
	words   []uint64 // the bitmap: bit i of word w is page 64*w+i
	mapping []byte   // what mmap returned; nil when the memory is the caller's

	mu       sync.Mutex
	unmapped bool
}

// Errors of MapDirtyLog, matched with errors.Is.
var (
	ErrDirtyLogSize   = errors.New("dirty log size")
	ErrDirtyLogOffset = errors.New("dirty log offset")
	ErrDirtyLogFile   = errors.New("dirty log file")
)

// MapDirtyLog maps size bytes of fd from offset as the dirty log, shared and
// read-write. Everything is the front-end's word and checked like any
// front-end input: size in 8..MaxDirtyLogSize and a multiple of 8 (QEMU's
// log is an array of 64-bit words), offset 8-aligned (atomic ORs need
// aligned words; mmap itself gets the page-aligned offset below it) and
// the range inside the file when the file has a size (memfd, tmpfs,
// hugetlbfs): mmap accepts a range past the end of a file, and touching it
// is a SIGBUS. The fd is not kept: the mapping holds its own reference.
func MapDirtyLog(fd int, size, offset uint64) (*DirtyLog, error) {
	if err := checkDirtyLogRange(size, offset); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("dirty log fd %d: %w: %w", fd, ErrDirtyLogFile, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		// Shared memory is a file (memfd, tmpfs, hugetlbfs); a device or
		// a pipe has no size to check the range against.
		return nil, fmt.Errorf("dirty log fd %d: mode %#o, not a regular file: %w", fd, st.Mode, ErrDirtyLogFile)
	}
	if fsize := uint64(st.Size); offset > fsize || size > fsize-offset {
		return nil, fmt.Errorf("dirty log: offset %#x + size %#x beyond the %d-byte file: %w", offset, size, fsize, ErrDirtyLogSize)
	}
	if err := CheckSharedFile(fd); err != nil {
		return nil, fmt.Errorf("dirty log: %w: %w", ErrDirtyLogFile, err)
	}
	page := uint64(os.Getpagesize())
	aligned := offset &^ (page - 1)
	delta := offset - aligned
	m, err := unix.Mmap(fd, int64(aligned), int(delta+size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("dirty log: map %#x bytes at offset %#x: %w", size, offset, err)
	}
	l := &DirtyLog{mapping: m, words: wordsOf(m[delta : delta+size])}
	return l, nil
}

func checkDirtyLogRange(size, offset uint64) error {
	switch {
	case size == 0 || size > MaxDirtyLogSize:
		return fmt.Errorf("dirty log: size %#x not in 8..%#x: %w", size, MaxDirtyLogSize, ErrDirtyLogSize)
	case size%8 != 0:
		return fmt.Errorf("dirty log: size %#x not a multiple of 8: %w", size, ErrDirtyLogSize)
	case offset%8 != 0:
		return fmt.Errorf("dirty log: offset %#x not 8-aligned: %w", offset, ErrDirtyLogOffset)
	case offset > math.MaxInt64-size:
		return fmt.Errorf("dirty log: offset %#x + size %#x too large: %w", offset, size, ErrDirtyLogOffset)
	}
	return nil
}

// NewDirtyLog uses memory the caller owns (tests, a mapping made elsewhere)
// as a dirty log; len(b) must be a non-zero multiple of 8 and b 8-aligned.
// Unmap only forgets it.
func NewDirtyLog(b []byte) (*DirtyLog, error) {
	if len(b) == 0 || len(b)%8 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		return nil, fmt.Errorf("dirty log: %d bytes, or not 8-aligned: %w", len(b), ErrDirtyLogSize)
	}
	return &DirtyLog{words: wordsOf(b)}, nil
}

// wordsOf views b (8-aligned, a multiple of 8 long) as 64-bit words. The
// log is little-endian like every host vunet runs on (NewSplitQueue refuses
// the others), so bit i of word w is bit i%8 of byte 8*w+i/8: the spec's
// "log[page / 8] |= 1 << page % 8".
func wordsOf(b []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// Size returns the log's size in bytes.
func (l *DirtyLog) Size() uint64 { return 8 * uint64(len(l.words)) }

// Mark sets the bits of every page the n bytes at guest-physical address gpa
// touch. It returns false when part of the range lies beyond the log (the
// front-end sized it too small, or a hostile address): those pages cannot
// be marked, the rest are.
func (l *DirtyLog) Mark(gpa, n uint64) bool {
	if n == 0 {
		return true
	}
	last := gpa + (n - 1)
	if last < gpa {
		last = math.MaxUint64
	}
	first, lastPage := gpa/DirtyLogPageSize, last/DirtyLogPageSize
	pages := 64 * uint64(len(l.words))
	ok := true
	if lastPage >= pages {
		ok = false
		if first >= pages {
			return false
		}
		lastPage = pages - 1
	}
	for w := first / 64; w <= lastPage/64; w++ {
		mask := ^uint64(0)
		if w == first/64 {
			mask &^= 1<<(first%64) - 1
		}
		if w == lastPage/64 {
			mask &= ^uint64(0) >> (63 - lastPage%64)
		}
		atomic.OrUint64(&l.words[w], mask)
	}
	return ok
}

// Dirty reports whether the page holding gpa is marked (tests, debugging).
func (l *DirtyLog) Dirty(gpa uint64) bool {
	p := gpa / DirtyLogPageSize
	if p/64 >= uint64(len(l.words)) {
		return false
	}
	return atomic.LoadUint64(&l.words[p/64])&(1<<(p%64)) != 0
}

// Unmap releases the mapping; it is idempotent. No queue built with the log
// may run any more.
func (l *DirtyLog) Unmap() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unmapped {
		return nil
	}
	l.unmapped = true
	m := l.mapping
	l.mapping, l.words = nil, nil
	if m == nil {
		return nil
	}
	if err := unix.Munmap(m); err != nil {
		return fmt.Errorf("unmap dirty log: %w", err)
	}
	return nil
}
