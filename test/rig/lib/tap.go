package rig

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// tapName is the guest's interface: the TAP lives alone in its namespace,
// so the name need not be unique and reads like a guest's NIC.
const tapName = "eth0"

// openTAP creates the guest's TAP device inside namespace ns: IFF_TAP (we
// move Ethernet frames), IFF_NO_PI (no packet-info prefix), IFF_VNET_HDR
// with hdrLen bytes (the virtio-net header, passed through unchanged in
// both directions) and the TUN_F_* offloads given. The fd is non-blocking;
// the device disappears when the fd is closed.
func openTAP(ns string, hdrLen int, offloads int) (int, error) {
	fd := -1
	err := inNetns(ns, func() error {
		var err error
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(tapName)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF %s: %w", tapName, err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, hdrLen); err != nil {
			return fmt.Errorf("TUNSETVNETHDRSZ %d: %w", hdrLen, err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, offloads); err != nil {
			return fmt.Errorf("TUNSETOFFLOAD %#x: %w", offloads, err)
		}
		return nil
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("tap in %s: %w", ns, err)
	}
	return fd, nil
}

// tunOffloads maps the negotiated virtio-net features to the TAP offloads.
//
// TUNSETOFFLOAD says what the *reader* of the TAP accepts. Here the reader
// is the rig's device-facing side: what it reads from the TAP is the guest's
// transmission, put on the TX queue for the back-end. So the relevant
// virtio bits are the ones saying what the *device* accepts on TX: CSUM
// (partial checksums), HOST_TSO4/6, HOST_ECN, HOST_UFO, HOST_USO. (QEMU's TAP
// back-end maps the GUEST_* bits instead, because there the TAP reader feeds
// the guest's RX queue; in the rig the roles are reversed.) The GUEST_* bits
// need no TAP setting: a TAP write accepts any virtio-net header, so RX
// frames with partial checksums or GSO go into the namespace as they are.
//
// The kernel refuses TSO/UFO/USO without TUN_F_CSUM, and virtio likewise
// makes HOST_TSO*/UFO/USO depend on CSUM, so nothing is enabled without it.
//
// HOST_USO is one bit for both families, and the kernel (tun_set_offload,
// Linux ≥ 6.2) takes TUN_F_USO4 and TUN_F_USO6 only together: they become
// one device feature, NETIF_F_GSO_UDP_L4. With it, a guest socket's
// UDP_SEGMENT send reaches the TAP reader as one GSO_UDP_L4 frame instead
// of a frame per datagram.
func tunOffloads(features uint64) int {
	has := func(bit int) bool { return features&frontend.Bit(bit) != 0 }
	if !has(frontend.FeatCSUM) {
		return 0
	}
	off := unix.TUN_F_CSUM
	if has(frontend.FeatHostTSO4) {
		off |= unix.TUN_F_TSO4
	}
	if has(frontend.FeatHostTSO6) {
		off |= unix.TUN_F_TSO6
	}
	if has(frontend.FeatHostECN) && off&(unix.TUN_F_TSO4|unix.TUN_F_TSO6) != 0 {
		off |= unix.TUN_F_TSO_ECN
	}
	if has(frontend.FeatHostUFO) {
		off |= unix.TUN_F_UFO
	}
	if has(frontend.FeatHostUSO) {
		off |= unix.TUN_F_USO4 | unix.TUN_F_USO6
	}
	return off
}

// offloadFeatureMask is what the rig's front-end accepts of the offloads
// offered: all of them, since the TAP handles each (see tunOffloads), but
// USO only where this kernel's TAP does (supportedOffloads).
var offloadFeatureMask = frontend.Bit(frontend.FeatCSUM) | frontend.Bit(frontend.FeatGuestCSUM) |
	frontend.Bit(frontend.FeatGuestTSO4) | frontend.Bit(frontend.FeatGuestTSO6) |
	frontend.Bit(frontend.FeatGuestECN) | frontend.Bit(frontend.FeatGuestUFO) |
	frontend.Bit(frontend.FeatHostTSO4) | frontend.Bit(frontend.FeatHostTSO6) |
	frontend.Bit(frontend.FeatHostECN) | frontend.Bit(frontend.FeatHostUFO) |
	usoFeatureMask

// usoFeatureMask is the USO bits: GUEST_USO4/6 and HOST_USO.
var usoFeatureMask = frontend.Bit(frontend.FeatGuestUSO4) | frontend.Bit(frontend.FeatGuestUSO6) |
	frontend.Bit(frontend.FeatHostUSO)

// supportedOffloads is offloadFeatureMask less USO on a kernel whose TAP
// does not take it (TapUSO): before Linux 6.2 TUNSETOFFLOAD refuses the
// USO bits, and a TAP write refuses a GSO_UDP_L4 frame, so a rig that
// negotiated USO could not even open its TAP.
func supportedOffloads() uint64 {
	if TapUSO() {
		return offloadFeatureMask
	}
	return offloadFeatureMask &^ usoFeatureMask
}

// TapUSO reports whether this kernel's TAP takes UDP segmentation offload
// (TUN_F_USO4|TUN_F_USO6, Linux 6.2 on), tried once on a TAP of a
// namespace of its own.
var TapUSO = sync.OnceValue(func() bool {
	ok := make(chan bool, 1)
	go func() {
		// The thread enters a namespace of its own and is never given
		// back to the scheduler: it ends with the goroutine.
		runtime.LockOSThread()
		if unix.Unshare(unix.CLONE_NEWNET) != nil {
			ok <- false
			return
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			ok <- false
			return
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq("")
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err == nil {
			err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_USO4|unix.TUN_F_USO6)
		}
		ok <- err == nil
	}()
	return <-ok
})
