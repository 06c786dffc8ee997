package guest

import (
	"bytes"
	"testing"
)

func TestStreamChunking(t *testing.T) {
	whole := make([]byte, 1000)
	_, _ = NewStream(42).Read(whole)
	st := NewStream(42)
	var got []byte
	for _, n := range []int{1, 7, 8, 9, 3, 64, 5, 903} {
		b := make([]byte, n)
		_, _ = st.Read(b)
		got = append(got, b...)
	}
	if !bytes.Equal(got, whole) {
		t.Fatal("chunked reads differ from one read")
	}
	other := make([]byte, 1000)
	_, _ = NewStream(43).Read(other)
	if bytes.Equal(other, whole) {
		t.Fatal("seeds 42 and 43 give the same stream")
	}
}

func TestXferSpecRoundTrip(t *testing.T) {
	s := XferSpec(XferUp, "[fe80::1%eth0]:5000", 100<<20)
	dir, target, n, err := ParseXferSpec(s)
	if err != nil || dir != XferUp || target != "[fe80::1%eth0]:5000" || n != 100<<20 {
		t.Fatalf("ParseXferSpec(%q) = %q %q %d %v", s, dir, target, n, err)
	}
	for _, bad := range []string{"", "sideways,a:1,5", "down,a:1", "down,a:1,-1", "up,a:1,x"} {
		if _, _, _, err := ParseXferSpec(bad); err == nil {
			t.Errorf("ParseXferSpec(%q) accepted", bad)
		}
	}
	if CheckBase("dhcp#2") != "dhcp" || CheckBase("xfer.down4") != "xfer.down4" {
		t.Error("CheckBase")
	}
}
