// Package virtqueue is vunet's view of guest memory and of split virtqueues,
// seen from the device side.
//
// It maps the memory regions a vhost-user front-end shares with us, translates
// guest-physical and front-end virtual addresses into bounded byte slices,
// walks descriptor chains (direct and indirect) into fixed-capacity iovecs,
// publishes used elements in batches, suppresses notifications with
// VIRTIO_RING_F_EVENT_IDX, and drives the kick and call eventfds. It also
// encodes and decodes the virtio-net header and names the feature bits.
//
// Everything read from guest memory is hostile: a descriptor is copied out
// once before it is checked, every address and length is checked against the
// memory table, and a malformed chain is returned to the guest as used with
// length 0 instead of being handed to the caller. Nothing here panics, blocks
// or exits on guest input.
//
// This package sits at the bottom of vunet's import graph: it must not import
// any other vunet package (vhostuser and tcpstack import it, not the other way
// round). The subpackage vqtest holds a test driver for code built on top of
// it.
package virtqueue
