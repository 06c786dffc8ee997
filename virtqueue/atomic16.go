//go:build amd64 || arm64

package virtqueue

// sync/atomic has no 16-bit operations, and the split ring's idx, flags and
// event fields are 16-bit words shared with the guest. These two helpers
// are the 16-bit counterparts of atomic.LoadUint32/StoreUint32, written in
// assembly: load16 is an acquire load, store16 a sequentially consistent
// store (XCHG on amd64, STLR on arm64, whose store-release orders before a
// later load-acquire), so store16 followed by load16 is the full barrier the
// notification protocol needs. Being opaque calls, they are also compiler
// barriers for the plain descriptor and used-element accesses around them.

const atomic16Supported = true

//go:noescape
func load16(p *uint16) uint16

//go:noescape
func store16(p *uint16, v uint16)
