package virtqueue_test

import (
	"fmt"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// The shape of a TX event loop iteration: pop a batch with kicks disabled,
// copy headers out before looking at them, push everything back, publish
// once, and re-enable kicks; EnableKicks returning true means more arrived
// in the meantime, so loop instead of sleeping on the kick eventfd.
func Example() {
	g, _ := vqtest.NewFlatMemory(1 << 20)
	defer g.Close()
	drv := vqtest.NewDriver(g, 256, 0x1000, 0x10000, 0x10000)
	frame := drv.Alloc(64)
	copy(g.Bytes(frame, 64), "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00hello")
	drv.AddChain(vqtest.Buf{GPA: frame, Len: 64})
	drv.Publish(false)

	cfg := drv.Config(false, false) // Kick/Call -1: no eventfds in this example
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	var c virtqueue.Chain
	var hdr [virtqueue.NetHdrLen + 5]byte
	for {
		q.DisableKicks()
		for {
			ok, err := q.Pop(&c)
			if err != nil || !ok {
				break
			}
			n := c.CopyReadable(hdr[:], 0)
			var vh virtqueue.NetHdr
			if vh.Decode(hdr[:virtqueue.NetHdrLen]) == nil {
				fmt.Printf("frame of %d bytes starts %q\n", c.ReadableLen()-virtqueue.NetHdrLen, hdr[virtqueue.NetHdrLen:n])
			}
			q.Push(c.Head, 0)
		}
		q.Flush()
		if !q.EnableKicks() {
			break // now wait for the kick eventfd, then DrainKick
		}
	}
	fmt.Println("used.idx", drv.UsedIdx())
	// Output:
	// frame of 52 bytes starts "hello"
	// used.idx 1
}
