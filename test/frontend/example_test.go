package frontend_test

import (
	"fmt"
	"time"

	"vunet/test/frontend"
)

// A typical test: connect to a back-end, run QEMU's start-up sequence,
// send a frame and wait for the answer.
func Example() {
	f, err := frontend.Dial("/tmp/vunet.sock")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	if err := f.Negotiate(frontend.Options{Layout: frontend.LayoutPCHole, RingSize: 256}); err != nil {
		fmt.Println(err)
		return
	}
	if err := f.PostRX(64, 2048); err != nil {
		fmt.Println(err)
		return
	}
	var arp []byte // an Ethernet frame, without the virtio-net header
	if err := f.SubmitTX(arp); err != nil {
		fmt.Println(err)
		return
	}
	frames, err := f.ReceiveRX(2 * time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(frames[0].Data), frames[0].Buffers)
	bases, _ := f.Stop() // SET_STATUS 0, GET_VRING_BASE per ring
	fmt.Println(bases)
}

// Hostile tests write the ring directly: here a descriptor that points at
// itself, made available and kicked.
func ExampleRing_SetDesc() {
	var f *frontend.Frontend // negotiated
	tx := f.Pair0().TX
	tx.SetDesc(100, frontend.Desc{Addr: 0x10000, Len: 64, Flags: frontend.DescFNext, Next: 100})
	used := tx.UsedIdx()
	tx.PushRawHead(100)
	tx.WaitUsedIdx(used+1, time.Second)
	fmt.Println(tx.UsedElem(used).Len) // 0: returned unread
}

// Malformed messages go through SendRaw: here a header announcing a
// payload size that never comes.
func ExampleFrontend_SendRaw() {
	var f *frontend.Frontend // connected
	f.SendRaw(frontend.EncodeHeader(frontend.ReqSetFeatures, frontend.FlagVersion, 1<<20), nil, nil)
}
