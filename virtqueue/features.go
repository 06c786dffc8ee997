package virtqueue

// Virtio feature bit numbers (not masks): test them with HasFeature or
// features&(1<<bit). Bits 0–23 are device specific (here virtio-net), 24–40
// are ring and transport bits.
const (
	FeatureNetCsum              = 0  // VIRTIO_NET_F_CSUM: device handles packets with partial checksum
	FeatureNetGuestCsum         = 1  // VIRTIO_NET_F_GUEST_CSUM: driver handles packets with partial checksum
	FeatureNetCtrlGuestOffloads = 2  // VIRTIO_NET_F_CTRL_GUEST_OFFLOADS
	FeatureNetMTU               = 3  // VIRTIO_NET_F_MTU: device reports a maximum MTU
	FeatureNetMAC               = 5  // VIRTIO_NET_F_MAC: device has a given MAC address
	FeatureNetGuestTSO4         = 7  // VIRTIO_NET_F_GUEST_TSO4
	FeatureNetGuestTSO6         = 8  // VIRTIO_NET_F_GUEST_TSO6
	FeatureNetGuestECN          = 9  // VIRTIO_NET_F_GUEST_ECN
	FeatureNetGuestUFO          = 10 // VIRTIO_NET_F_GUEST_UFO
	FeatureNetHostTSO4          = 11 // VIRTIO_NET_F_HOST_TSO4
	FeatureNetHostTSO6          = 12 // VIRTIO_NET_F_HOST_TSO6
	FeatureNetHostECN           = 13 // VIRTIO_NET_F_HOST_ECN
	FeatureNetHostUFO           = 14 // VIRTIO_NET_F_HOST_UFO
	FeatureNetMrgRxbuf          = 15 // VIRTIO_NET_F_MRG_RXBUF: RX frames may span several chains (num_buffers)
	FeatureNetStatus            = 16 // VIRTIO_NET_F_STATUS
	FeatureNetCtrlVQ            = 17 // VIRTIO_NET_F_CTRL_VQ
	FeatureNetCtrlRx            = 18 // VIRTIO_NET_F_CTRL_RX
	FeatureNetCtrlVLAN          = 19 // VIRTIO_NET_F_CTRL_VLAN
	FeatureNetGuestAnnounce     = 21 // VIRTIO_NET_F_GUEST_ANNOUNCE
	FeatureNetMQ                = 22 // VIRTIO_NET_F_MQ: several queue pairs
	FeatureNetCtrlMACAddr       = 23 // VIRTIO_NET_F_CTRL_MAC_ADDR

	FeatureNotifyOnEmpty    = 24 // VIRTIO_F_NOTIFY_ON_EMPTY (legacy)
	FeatureAnyLayout        = 27 // VIRTIO_F_ANY_LAYOUT (legacy; implied by VERSION_1)
	FeatureRingIndirectDesc = 28 // VIRTIO_RING_F_INDIRECT_DESC
	FeatureRingEventIdx     = 29 // VIRTIO_RING_F_EVENT_IDX
	FeatureVersion1         = 32 // VIRTIO_F_VERSION_1
	FeatureAccessPlatform   = 33 // VIRTIO_F_ACCESS_PLATFORM (IOMMU; not supported here)
	FeatureRingPacked       = 34 // VIRTIO_F_RING_PACKED
	FeatureInOrder          = 35 // VIRTIO_F_IN_ORDER
	FeatureOrderPlatform    = 36 // VIRTIO_F_ORDER_PLATFORM
	FeatureSRIOV            = 37 // VIRTIO_F_SR_IOV
	FeatureNotificationData = 38 // VIRTIO_F_NOTIFICATION_DATA

	FeatureNetGuestUSO4  = 54 // VIRTIO_NET_F_GUEST_USO4
	FeatureNetGuestUSO6  = 55 // VIRTIO_NET_F_GUEST_USO6
	FeatureNetHostUSO    = 56 // VIRTIO_NET_F_HOST_USO
	FeatureNetHashReport = 57 // VIRTIO_NET_F_HASH_REPORT
	FeatureNetRSS        = 60 // VIRTIO_NET_F_RSS
	FeatureNetRSCExt     = 61 // VIRTIO_NET_F_RSC_EXT
	FeatureNetStandby    = 62 // VIRTIO_NET_F_STANDBY
	FeatureNetSpeedDplx  = 63 // VIRTIO_NET_F_SPEED_DUPLEX
)

// HasFeature reports whether feature bit bit is set in features. Bits above
// 63 are never set.
func HasFeature(features uint64, bit uint) bool {
	return bit < 64 && features&(1<<bit) != 0
}

// Split ring flag values (virtio 1.x, 2.7).
const (
	DescFlagNext     = 1 // VIRTQ_DESC_F_NEXT: the chain continues at Next
	DescFlagWrite    = 2 // VIRTQ_DESC_F_WRITE: buffer is device-writable
	DescFlagIndirect = 4 // VIRTQ_DESC_F_INDIRECT: buffer is a table of descriptors

	AvailFlagNoInterrupt = 1 // VIRTQ_AVAIL_F_NO_INTERRUPT: driver asks for no used notifications
	UsedFlagNoNotify     = 1 // VIRTQ_USED_F_NO_NOTIFY: device asks for no kicks
)
