package virtqueue

// LoadUint16 atomically loads *p with acquire ordering. It is the 16-bit
// load the split ring's index fields need and sync/atomic lacks, exported
// for drivers simulated in other processes' memory views (vqtest, test
// front-ends). p must be 2-aligned.
func LoadUint16(p *uint16) uint16 { return load16(p) }

// StoreUint16 atomically stores v to *p with sequentially consistent
// ordering (a later LoadUint16 cannot pass it). p must be 2-aligned.
func StoreUint16(p *uint16, v uint16) { store16(p, v) }
