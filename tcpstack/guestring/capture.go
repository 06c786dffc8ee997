package guestring

// FrameCapture receives a copy of every frame crossing the guest link, both
// directions (cmd/vunet's pcap writer implements it; tcpstack does not
// import it). Frame is called on the pair's event loop with the frame's n
// bytes after the first skip bytes of iov (the virtio-net header); iov
// points into guest memory and is only valid during the call, so the
// implementation must copy what it keeps, must not block and should not
// allocate: it runs on the hot path.
type FrameCapture interface {
	Frame(pair int, iov [][]byte, skip, n int)
}

// rxCaptureIovMax bounds the buffers of one captured RX frame: the writable
// buffers of every chain the frame spans. A frame scattered over more is
// captured truncated (its first bytes, which hold the headers).
const rxCaptureIovMax = 2 * rxIovMax

// captureCommitted passes the frame just pushed in chains res[first:first+n]
// (total bytes, virtio-net header included) to the capture.
func (r *Writer) captureCommitted(first, n, total int) {
	iov := r.capIov[:0]
	covered := 0
	for i := first; i < first+n && covered < total; i++ {
		for _, b := range r.res[i].Writable {
			if len(iov) == cap(iov) || covered >= total {
				break
			}
			if len(b) > total-covered {
				b = b[:total-covered]
			}
			iov = append(iov, b)
			covered += len(b)
		}
	}
	if covered <= r.vhLen {
		return
	}
	r.capture.Frame(r.pair, iov, r.vhLen, covered-r.vhLen)
}
