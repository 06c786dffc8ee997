package virtqueue_test

import (
	"bytes"
	"testing"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// chainOf pops a chain of readable segments rd and writable segments wr
// (lengths), filled with consecutive byte values.
func chainOf(t testing.TB, r *rig, rd, wr []uint32) *virtqueue.Chain {
	t.Helper()
	var bufs []vqtest.Buf
	v := byte(0)
	for _, l := range rd {
		gpa := r.d.Alloc(uint64(l))
		for i, b := 0, r.g.Bytes(gpa, uint64(l)); i < len(b); i++ {
			b[i] = v
			v++
		}
		bufs = append(bufs, vqtest.Buf{GPA: gpa, Len: l})
	}
	for _, l := range wr {
		bufs = append(bufs, vqtest.Buf{GPA: r.d.Alloc(uint64(l)), Len: l, Write: true})
	}
	if _, err := r.d.AddChain(bufs...); err != nil {
		t.Fatal(err)
	}
	r.d.Publish(false)
	c := new(virtqueue.Chain)
	if !r.pop(t, c) {
		t.Fatal("empty")
	}
	return c
}

func TestCopyReadable(t *testing.T) {
	r := newRig(t, rigOpt{size: 16})
	c := chainOf(t, r, []uint32{3, 0, 5, 4}, nil)
	all := make([]byte, 12)
	for i := range all {
		all[i] = byte(i)
	}
	for _, tc := range []struct {
		off, n int
		want   []byte
	}{
		{0, 12, all},
		{0, 20, all},
		{2, 4, all[2:6]},
		{3, 5, all[3:8]},
		{7, 3, all[7:10]},
		{11, 5, all[11:]},
		{12, 5, nil},
		{100, 5, nil},
		{-1, 5, nil},
		{4, 0, nil},
	} {
		dst := make([]byte, tc.n)
		n := c.CopyReadable(dst, tc.off)
		if !bytes.Equal(dst[:n], tc.want) {
			t.Errorf("CopyReadable(%d bytes, off %d) = %x, want %x", tc.n, tc.off, dst[:n], tc.want)
		}
	}
}

func TestCopyToWritable(t *testing.T) {
	r := newRig(t, rigOpt{size: 16})
	for _, tc := range []struct {
		off  int
		src  string
		n    int
		want string // writable bytes afterwards, '.' = untouched zero
	}{
		{0, "abcdefgh", 8, "abc|defg|h."},
		{2, "xyz", 3, "..x|yz..|.."},
		{7, "0123456789", 2, "...|....|01"},
		{9, "q", 0, "...|....|.."},
		{-1, "q", 0, "...|....|.."},
	} {
		c := chainOf(t, r, []uint32{1}, []uint32{3, 4, 2})
		if n := c.CopyToWritable(tc.off, []byte(tc.src)); n != tc.n {
			t.Errorf("CopyToWritable(%d, %q) = %d, want %d", tc.off, tc.src, n, tc.n)
		}
		var got []byte
		for i, b := range c.Writable {
			if i > 0 {
				got = append(got, '|')
			}
			for _, x := range b {
				if x == 0 {
					x = '.'
				}
				got = append(got, x)
			}
		}
		if string(got) != tc.want {
			t.Errorf("CopyToWritable(%d, %q): writable %q, want %q", tc.off, tc.src, got, tc.want)
		}
		r.q.Push(c.Head, 0)
		r.q.Flush()
		r.d.Reclaim()
	}
}
