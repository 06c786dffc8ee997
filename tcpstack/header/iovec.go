package header

// Frames in guest memory are scattered over buffers (a descriptor chain's
// iovecs). These helpers read, write and checksum such a frame as if its
// buffers were one byte slice.

// ChecksumIovecs adds the first n bytes of the concatenated bufs to the
// uncomplemented one's complement sum initial (see Checksum), whatever the
// buffers' lengths: a buffer that starts at an odd offset of the whole
// contributes its sum byte-swapped (RFC 1071 2(B)), so an odd-length
// buffer needs no carrying of its last byte into the next.
func ChecksumIovecs(bufs [][]byte, n int, initial uint16) uint16 {
	sum := initial
	odd := false
	for _, b := range bufs {
		if n <= 0 {
			break
		}
		if len(b) > n {
			b = b[:n]
		}
		n -= len(b)
		c := Checksum(b, 0)
		if odd {
			c = c<<8 | c>>8
		}
		sum = ChecksumCombine(sum, c)
		if len(b)&1 == 1 {
			odd = !odd
		}
	}
	return sum
}

// SliceIovecs appends to dst, without copying, the pieces of the
// concatenated bufs that hold bytes [off, off+n), skipping empty ones, as
// far as dst's capacity takes them. It returns dst and the bytes the
// pieces cover (fewer than n when bufs or dst's capacity end first).
func SliceIovecs(dst [][]byte, bufs [][]byte, off, n int) ([][]byte, int) {
	covered := 0
	for _, b := range bufs {
		if covered == n || len(dst) == cap(dst) {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		b = b[off:min(len(b), off+n-covered)]
		off = 0
		dst = append(dst, b)
		covered += len(b)
	}
	return dst, covered
}

// CopyFromIovecs copies the bytes of the concatenated bufs from offset off
// on into dst and returns how many it copied (fewer than len(dst) when the
// buffers end first).
func CopyFromIovecs(dst []byte, bufs [][]byte, off int) int {
	n := 0
	for _, b := range bufs {
		if n == len(dst) {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n += copy(dst[n:], b[off:])
		off = 0
	}
	return n
}

// WriteIovecs copies src into the concatenated bufs at offset off, as far
// as the buffers reach, and returns how many bytes it copied.
func WriteIovecs(bufs [][]byte, off int, src []byte) int {
	n := 0
	for _, b := range bufs {
		if n == len(src) {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n += copy(b[off:], src[n:])
		off = 0
	}
	return n
}
