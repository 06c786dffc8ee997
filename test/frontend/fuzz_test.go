package frontend

import (
	"testing"
)

// FuzzRXAssembler feeds used RX buffers of arbitrary content and size to the
// MRG_RXBUF reassembly: a buggy back-end must produce errors, not panics.
// The first byte selects mergeable mode; then each chunk is a length byte
// followed by that many bytes.
func FuzzRXAssembler(f *testing.F) {
	hdr := make([]byte, 12)
	NetHdr{NumBuffers: 2}.Encode(hdr)
	f.Add(append([]byte{1, 14}, append(hdr, 0xaa, 0xbb)...))
	f.Add([]byte{1, 3, 0, 0, 0})
	f.Add([]byte{0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		a := rxAssembler{hdrLen: 12, mrg: in[0]&1 == 1}
		in = in[1:]
		total := 0
		for len(in) > 0 {
			n := min(int(in[0]), len(in)-1)
			chunk := in[1 : 1+n]
			in = in[1+n:]
			fr, done, err := a.add(chunk)
			if err != nil {
				a = rxAssembler{hdrLen: 12, mrg: a.mrg}
				continue
			}
			total += len(chunk)
			if done && len(fr.Data) > total {
				t.Fatalf("frame of %d bytes from %d input bytes", len(fr.Data), total)
			}
			if done {
				total = 0
			}
		}
	})
}

// FuzzRecv feeds arbitrary back-end bytes to the reply reader: it must
// return a message or an error, never panic or allocate without bound.
func FuzzRecv(f *testing.F) {
	f.Add(append(EncodeHeader(ReqGetFeatures, FlagVersion|FlagReply, 8), PayloadU64(1<<30)...))
	f.Add(EncodeHeader(ReqGetVringBase, FlagVersion|FlagReply, 0xffffffff))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := socketPair(t)
		defer a.Close()
		go func() {
			b.Write(in)
			b.Close()
		}()
		m, err := NewConn(a).Recv()
		if err == nil && len(m.Payload) > MaxReplyPayload {
			t.Fatalf("payload of %d bytes accepted", len(m.Payload))
		}
	})
}
