package frontend

// Request is a vhost-user front-end request type (the message header's first word).
type Request uint32

// Front-end request types, numbered as in the vhost-user specification.
const (
	ReqGetFeatures         Request = 1
	ReqSetFeatures         Request = 2
	ReqSetOwner            Request = 3
	ReqResetOwner          Request = 4
	ReqSetMemTable         Request = 5
	ReqSetLogBase          Request = 6
	ReqSetLogFD            Request = 7
	ReqSetVringNum         Request = 8
	ReqSetVringAddr        Request = 9
	ReqSetVringBase        Request = 10
	ReqGetVringBase        Request = 11
	ReqSetVringKick        Request = 12
	ReqSetVringCall        Request = 13
	ReqSetVringErr         Request = 14
	ReqGetProtocolFeatures Request = 15
	ReqSetProtocolFeatures Request = 16
	ReqGetQueueNum         Request = 17
	ReqSetVringEnable      Request = 18
	ReqSendRARP            Request = 19
	ReqNetSetMTU           Request = 20
	ReqSetSlaveReqFD       Request = 21
	ReqIOTLBMsg            Request = 22
	ReqSetVringEndian      Request = 23
	ReqGetConfig           Request = 24
	ReqSetConfig           Request = 25
	ReqGetInflightFD       Request = 31
	ReqSetInflightFD       Request = 32
	ReqResetDevice         Request = 34
	ReqVringKick           Request = 35
	ReqGetMaxMemSlots      Request = 36
	ReqAddMemReg           Request = 37
	ReqRemMemReg           Request = 38
	ReqSetStatus           Request = 39
	ReqGetStatus           Request = 40
)

// Header flag bits.
const (
	FlagVersion   uint32 = 0x1 // protocol version 1 in the low two bits
	FlagReply     uint32 = 0x4 // set by the back-end on replies
	FlagNeedReply uint32 = 0x8 // REPLY_ACK: ask for a u64 status reply
)

// HeaderLen is the size of the request/flags/size header.
const HeaderLen = 12

// VringNoFD is bit 8 of a kick/call/err payload: no fd attached (polling).
const VringNoFD uint64 = 0x100

// MaxFDs is how many fds QEMU attaches at most to one message.
const MaxFDs = 8

// Protocol feature bits (GET/SET_PROTOCOL_FEATURES).
const (
	ProtoMQ                = 0
	ProtoLogSHMFD          = 1
	ProtoRARP              = 2
	ProtoReplyAck          = 3
	ProtoMTU               = 4
	ProtoSlaveReq          = 5
	ProtoCrossEndian       = 6
	ProtoConfig            = 9
	ProtoInflightSHMFD     = 12
	ProtoResetDevice       = 13
	ProtoInbandNotify      = 14
	ProtoConfigureMemSlots = 15
	ProtoStatus            = 16
)

// Virtio feature bits relevant to a network device.
const (
	FeatCSUM             = 0
	FeatGuestCSUM        = 1
	FeatCtrlGuestOffload = 2
	FeatMTU              = 3
	FeatMAC              = 5
	FeatGuestTSO4        = 7
	FeatGuestTSO6        = 8
	FeatGuestECN         = 9
	FeatGuestUFO         = 10
	FeatHostTSO4         = 11
	FeatHostTSO6         = 12
	FeatHostECN          = 13
	FeatHostUFO          = 14
	FeatMrgRxbuf         = 15
	FeatStatus           = 16
	FeatCtrlVQ           = 17
	FeatMQ               = 22
	FeatNotifyOnEmpty    = 24
	FeatLogAll           = 26
	FeatAnyLayout        = 27
	FeatIndirectDesc     = 28
	FeatEventIdx         = 29
	FeatProtocolFeatures = 30
	FeatVersion1         = 32
	FeatAccessPlatform   = 33
	FeatRingPacked       = 34
	// UDP segmentation offload (virtio 1.2): the device may hand the
	// driver GSO_UDP_L4 frames over IPv4 or IPv6 (GUEST_USO4/6), and
	// accepts them from it (HOST_USO).
	FeatGuestUSO4 = 54
	FeatGuestUSO6 = 55
	FeatHostUSO   = 56
)

// Bit returns 1<<n as a feature mask.
func Bit(n int) uint64 { return 1 << uint(n) }

// DefaultFeatureMask is what Negotiate accepts of the offered features unless
// told otherwise: the ring and buffer features this driver implements, but no
// offloads, so frames arrive fully checksummed and never above the MTU.
var DefaultFeatureMask = Bit(FeatVersion1) | Bit(FeatMrgRxbuf) | Bit(FeatEventIdx) |
	Bit(FeatIndirectDesc) | Bit(FeatMQ) | Bit(FeatMTU) | Bit(FeatProtocolFeatures)

// DefaultProtocolMask is the protocol features Negotiate accepts by default.
var DefaultProtocolMask = Bit(ProtoMQ) | Bit(ProtoReplyAck) | Bit(ProtoMTU) |
	Bit(ProtoConfigureMemSlots) | Bit(ProtoStatus) | Bit(ProtoRARP)

// Device status bits (SET_STATUS).
const (
	StatusAcknowledge = 0x1
	StatusDriver      = 0x2
	StatusDriverOK    = 0x4
	StatusFeaturesOK  = 0x8
)
