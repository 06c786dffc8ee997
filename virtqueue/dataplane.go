package virtqueue

import "io"

// The data-plane contract: what a control plane (package vhostuser) hands a
// data plane (package tcpstack) and calls on it. It is declared here, in the
// package both import, so neither imports the other and no adapter sits
// between them.

// QueuePair is one virtio-net queue pair as the control plane hands it to the
// data plane.
type QueuePair struct {
	Index                int         // pair number: rings 2*Index (RX) and 2*Index+1 (TX)
	RX, TX               *SplitQueue // never nil when passed to StartPair
	RXEnabled, TXEnabled bool        // SET_VRING_ENABLE state (true when PROTOCOL_FEATURES is not negotiated)
	Features             uint64      // negotiated virtio feature bits (NetHdrLenFor etc.)
	// ControlFD is the front-end's vhost-user socket; 0 or less: none. The
	// data plane may watch it (never read it) to hand the control plane a
	// CPU the moment a message comes (tcpstack/loop_wait.go). A pair that
	// did not stop in time outlives the session, and the number may then
	// name another file: register it, never EPOLL_CTL_MOD/DEL it by number.
	ControlFD int
}

// DataPlane runs queue pairs. Its methods, and those of the optional
// interfaces below, are called from the control goroutine only, never
// concurrently.
type DataPlane interface {
	// StartPair runs pair qp.Index's rings until StopPair.
	StartPair(qp QueuePair) error
	// StopPair returns only when the data plane no longer touches the
	// pair's rings: every popped chain pushed and flushed, RX reservations
	// rewound (Unpop). The control plane may unmap memory right after.
	StopPair(index int)
}

// Announcer is an optional DataPlane interface: SEND_RARP asks the back-end
// to announce the guest's MAC after a migration.
type Announcer interface {
	Announce(mac [6]byte)
}

// SessionEnder is an optional DataPlane interface: EndSession is called,
// with every pair already stopped, when the guest's side of the data plane's
// state is gone — the front-end disconnected, or sent RESET_OWNER or
// RESET_DEVICE. A network back-end closes its flows then, so host peers
// learn at once instead of waiting for their own timeouts.
type SessionEnder interface {
	EndSession()
}

// Migrator is an optional DataPlane interface: MigrationStopped is called
// when the front-end has stopped every ring while it live-migrates the
// guest (VHOST_F_LOG_ALL negotiated): the guest's state is about to run
// elsewhere, unless the migration fails and the rings start here again. A
// network back-end hands its flows to the destination's back-end then.
type Migrator interface {
	MigrationStopped()
}

// StateTransfer is an optional DataPlane interface: the back-end's own
// state in a live migration, carried by the front-end in its migration
// stream (vhost-user VHOST_USER_PROTOCOL_F_DEVICE_STATE). SaveState is
// called on the source with every pair stopped and writes the state to w;
// LoadState on the destination, before any pair starts, reads it from r
// to its end. Each runs on a goroutine of its own while the control plane
// goes on.
type StateTransfer interface {
	SaveState(w io.Writer) error
	LoadState(r io.Reader) error
}

// MTUSetter is an optional DataPlane interface: NET_SET_MTU passes QEMU's
// host_mtu to the back-end.
type MTUSetter interface {
	SetMTU(mtu int)
}
