package rig

import (
	"log/slog"
	"net/netip"
	"strconv"
	"time"

	"vunet/test/frontend"
)

// Options configures one rig. The zero value is a vunet back-end, 256-entry
// rings, static guest addressing and no namespace tuning.
type Options struct {
	// Backend is the back-end's command line; "{socket}" in any argument is
	// replaced by the vhost-user socket path, "{metrics}" by the metrics
	// address (MetricsAddr), "{mtu}" by MTU and "{vunet}" by the vunet
	// binary. Empty means
	// DefaultBackend. The back-end must listen on {socket}.
	Backend []string
	// Frontend is the vhost-user front-end: the rig's own (default) or
	// FrontendTestpmd. With testpmd the guest MTU is 1500 at most (0 means
	// 1500), the rig's own ring and buffer options do not apply, and the
	// back-end is not told the MTU (testpmd sends no NET_SET_MTU): pass
	// it on its command line ({mtu}).
	Frontend Frontend
	// BackendEnv is added to the back-end's environment.
	BackendEnv []string
	// Loopback measures the rig front-end alone (kernel ↔ rig ↔ kernel): no
	// back-end runs; a second TAP in a peer namespace is bridged by the
	// same front-end code, and an in-process device copies each frame one
	// pair transmits into the other's RX ring, and (without Impair) writes
	// it to the other TAP on the same thread (see crossDevice). The peer
	// namespace takes the host namespace's place (HostNetns, HostListen,
	// HostCommand), at Gateway(); addressing is static; Backend, DHCP and
	// the guest address options are ignored.
	Loopback bool
	// NoHostNetns runs the back-end in the rig's own namespace instead of a
	// fresh one (host peers then use the real host loopback; HostSysctls
	// must be empty).
	NoHostNetns bool
	// HostSysctls are set in the back-end's namespace before it starts, e.g.
	// {"net.ipv4.tcp_rmem": "4096 16384 65536"} or
	// {"net.ipv4.ping_group_range": "0 2147483647"} for ping sockets.
	HostSysctls map[string]string
	// GuestSysctls are set in the guest namespace.
	GuestSysctls map[string]string
	// HostAddr is the address of the veth interface in the host namespace
	// whose default route goes via HostGateway; vunet hands both to the
	// guest (the guest gets the host's address, like passt). Defaults
	// 10.213.0.2/24 and 10.213.0.1.
	HostAddr    netip.Prefix
	HostGateway netip.Addr

	// RingSize is the size of both rings (default 256, a power of two
	// 16..32768); RXRingSize / TXRingSize override one direction.
	RingSize, RXRingSize, TXRingSize uint16
	// BufSize is the size of every RX and TX buffer (default: large enough
	// for a 64 KiB frame plus the virtio-net header).
	BufSize int
	// SlowRX makes the guest a slow reader: used RX buffers are held this
	// long before they are posted again (0: posted at once).
	SlowRX time.Duration
	// FeatureMask limits the virtio features accepted (0: the front-end's
	// defaults plus every offload the TAP can carry).
	FeatureMask uint64

	// QueuePairs is how many queue pairs the front-end negotiates and
	// bridges (default 1, at most 8); with more than one, the default
	// back-end is given --queues. The back-end's frames are taken from
	// every RX ring; the guest's go to one TX ring at a time (pair 0,
	// or as TXRotate moves them).
	QueuePairs int
	// TXRotate > 0 moves the guest's transmissions to the next queue
	// pair's TX ring that often, the way a Linux guest moves a socket to
	// another TX queue when its thread changes vCPU: once every frame
	// handed to the old ring came back (its ooo_okay), or at once with
	// TXRotateEager.
	TXRotate      time.Duration
	TXRotateEager bool
	// Impair damages frames between the guest and the back-end, both ways
	// (loss, reordering, duplication; see Impairment). In the rig-alone
	// mode the guest's side is impaired, so each direction is damaged
	// once there too.
	Impair Impairment
	// RXObserve, if set, sees every frame the back-end sent to the guest
	// (Ethernet frame, virtio-net header stripped) with its queue pair,
	// on the thread that writes it to the TAP, before the TAP gets it.
	RXObserve func(pair int, frame []byte)
	// RXObserveHdr, if set, sees the same frames with their virtio-net
	// header as the back-end wrote it (before the rig turns DATA_VALID
	// into NEEDS_CSUM for the TAP, trustDataValid). frame is what the
	// first RX buffer holds: all of it with the default BufSize.
	RXObserveHdr func(pair int, hdr frontend.NetHdr, frame []byte)

	// DHCP configures the guest with busybox udhcpc from the back-end's DHCP
	// server; otherwise the guest gets GuestAddr via GuestGateway.
	DHCP bool
	// GuestAddr and GuestGateway are the static configuration (defaults:
	// HostAddr and HostGateway, which is what vunet would hand out).
	GuestAddr    netip.Prefix
	GuestGateway netip.Addr
	// MTU > 0 is sent to the back-end (NET_SET_MTU) and set on the guest's
	// interface; 0 keeps what DHCP says (static: 65520).
	MTU int

	// MetricsAddr is the back-end's metrics address inside its namespace
	// ({metrics}); default 127.0.0.1:9323.
	MetricsAddr string
	// Log receives the rig's own log lines; nil discards them.
	Log *slog.Logger
	// StartTimeout bounds back-end start-up, negotiation and DHCP (default
	// 20s).
	StartTimeout time.Duration
}

// DefaultBackend is vunet listening on the rig's socket, exiting when the
// front-end leaves, with metrics.
var DefaultBackend = []string{"{vunet}", "--socket", "{socket}", "--one-off", "--metrics", "{metrics}"}

const (
	defaultMTU     = 65520
	maxFrame       = 65535 + 14 + 4 // a 64 KiB GSO frame with Ethernet and VLAN headers
	defaultMetrics = "127.0.0.1:9323"
)

func (o Options) withDefaults() Options {
	if o.QueuePairs <= 0 {
		o.QueuePairs = 1
	}
	if len(o.Backend) == 0 {
		o.Backend = DefaultBackend
		if o.QueuePairs > 1 {
			o.Backend = append(append([]string{}, DefaultBackend...), "--queues", strconv.Itoa(o.QueuePairs))
		}
	}
	if !o.HostAddr.IsValid() {
		o.HostAddr = netip.MustParsePrefix("10.213.0.2/24")
	}
	if !o.HostGateway.IsValid() {
		o.HostGateway = netip.MustParseAddr("10.213.0.1")
	}
	if !o.GuestAddr.IsValid() {
		o.GuestAddr = o.HostAddr
	}
	if !o.GuestGateway.IsValid() {
		o.GuestGateway = o.HostGateway
	}
	if o.RingSize == 0 {
		o.RingSize = 256
	}
	if o.RXRingSize == 0 {
		o.RXRingSize = o.RingSize
	}
	if o.TXRingSize == 0 {
		o.TXRingSize = o.RingSize
	}
	if o.BufSize <= 0 {
		o.BufSize = (12 + maxFrame + 63) &^ 63
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = defaultMetrics
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 20 * time.Second
	}
	if o.Frontend == FrontendTestpmd && o.MTU == 0 {
		o.MTU = testpmdMTU
	}
	return o
}
