// Package rig is "the rig": an in-process vhost-user front-end bridged to a
// Linux TAP device inside a network namespace of its own, so that the
// kernel's TCP/IP stack in that namespace plays the guest at full speed
// against any vhost-user back-end (vunet by default).
//
// Layout of one rig (names are unique per process and rig):
//
//	guest netns vunet-rig-<pid>-<n>-guest      host netns vunet-rig-<pid>-<n>-host
//	  eth0 (TAP, IFF_VNET_HDR) ── this process ── vhost-user ── back-end (vunet)
//	  udhcpc / test clients       (FixedRing TX/RX)               host peers on 127.0.0.1
//
// The front-end copies nothing: frames are read from the TAP straight into
// guest TX buffers in the front-end's memfd and written to the TAP straight
// from used RX buffers, with the virtio-net header passed through unchanged
// both ways. Everything is event-driven (epoll on the TAP, the call
// eventfds and a timerfd for the slow-reader mode).
//
// The back-end runs in the host namespace, where a veth interface with an
// address and a default route gives it a host-like address configuration;
// the guest reaches host peers listening on that namespace's loopback
// through its gateway address (vunet maps gateway → host loopback).
//
// Teardown is complete on Close, on test cleanup and on SIGINT/SIGTERM:
// processes, TAP, namespaces and the work directory. Namespaces left behind
// by a process that died anyway are swept by the next Start (Sweep).
//
// rig may import anything (it is test code); vunet's packages must not
// import it.
package rig
