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
// eventfds and a timerfd for the slow-reader mode), one locked thread per
// loop; each loop raises GOMAXPROCS by one while it runs (procs.go says
// why).
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
// # Use from Go
//
//	r := rig.StartTB(t, rig.Options{DHCP: true, RXRingSize: 16, SlowRX: time.Millisecond,
//		HostSysctls: map[string]string{"net.ipv4.tcp_rmem": "4096 16384 65536"}})
//	l, _ := r.HostListen("tcp4", "127.0.0.1:5201")          // host peer, back-end's netns
//	c, _ := r.GuestDial(ctx, "tcp4", r.Gateway().String()+":5201") // guest, through vunet
//	out, err := r.GuestExec(ctx, "ping", "-c1", r.Gateway().String())
//	m, _ := r.Metrics(ctx) // the back-end's Prometheus endpoint, scraped inside its netns
//
// Options.Backend is a command template ({socket}, {metrics}, {vunet}), so
// the same test can measure any vhost-user back-end that listens on a UNIX
// socket.
//
// # Several queue pairs, a lossy link
//
// Options.QueuePairs bridges one TAP to several queue pairs: the back-end's
// frames are taken from every RX ring (each by a thread of its own, as a
// guest's interrupts would), the guest's go to one TX ring, which
// Options.TXRotate moves to the next pair on a timer the way a Linux guest
// moves a socket when its thread changes vCPU. Options.Impair makes the
// link lossy both ways (loss, reordering, duplication per frame, from a
// seeded generator; impair.go): this host's kernel has no netem.
//
// # Command line
//
//	go run ./test/rig up [-ring N] [-rx-ring N] [-slow-rx 1ms] [-mtu N] [-static]
//	    [-host-sysctl k=v]... [-guest-sysctl k=v]... [-backend 'CMD {socket} ...']
//	go run ./test/rig exec [--host] -- CMD ARGS...   # in the guest (or back-end) netns
//	go run ./test/rig status
//	go run ./test/rig down                            # every rig, plus stale leftovers
//
// "up" stays in the foreground and prints the namespaces; Ctrl-C, SIGTERM or
// "rig down" tears everything down.
//
// # Offloads
//
// The TAP gets exactly the offloads the back-end accepts on its TX queue
// (CSUM, HOST_TSO4/6, HOST_ECN, HOST_UFO, HOST_USO → TUN_F_*, USO4 and USO6
// together), see tunOffloads; the GUEST_* offloads (GUEST_USO4/6 included)
// need no TAP setting because a TAP write accepts any virtio-net header.
// The rig-alone device copies headers as they are, so a GSO_UDP_L4 frame one
// TAP hands over is written whole to the other.
//
// rig may import anything (it is test code); vunet's packages must not
// import it.
package rig
