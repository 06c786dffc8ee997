// Package frontend is an in-process vhost-user front-end: it plays QEMU's role
// (and the guest virtio-net driver's) against a vhost-user back-end so unit
// tests, the netns/TAP rig and end-to-end suites can drive vunet without a VM.
//
// It owns guest memory (a memfd, optionally split into QEMU-like regions), the
// vhost-user message layer (including raw, malformed messages for hostile
// tests), the start-up sequences of QEMU 7.2 and of DPDK's virtio-user, and the
// driver side of split virtqueues (RX buffer posting, TX submission, used-ring
// reaping, MRG_RXBUF reassembly, EVENT_IDX notification handling).
//
// It must not import any vunet package: it is an independent implementation of
// the same protocol and ring layout, so a misunderstanding shared by vunet's
// own vhostuser/virtqueue code cannot hide behind a shared implementation.
package frontend
