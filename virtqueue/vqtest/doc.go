// Package vqtest simulates the driver (guest) side of split virtqueues over
// memfd-backed guest memory, for tests of virtqueue and of the code built on
// it. It is the module's one test driver: virtqueue's, vhostuser's and
// tcpstack's tests all post and reclaim buffers through it.
//
// The memory is mapped twice, as a real front-end would have it: once
// through virtqueue.MapRegion (the device's view) and once as one flat
// mapping of the memfd (the driver's view). A Driver lays out one ring and
// allocates data buffers; a Ring adds the kick and call eventfds and the
// device-side SplitQueue, rebuilt the way the control plane does.
//
// It is test support: misuse (addresses outside the memory, descriptor
// exhaustion) panics or returns errors without trying to be clever.
package vqtest
