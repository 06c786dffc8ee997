package rig

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// impairRun sends n numbered frames through a bridge that damages both
// ways and an echo device, and returns the numbers of the echoes in the
// order they came back. Each echo is checked byte for byte.
func impairRun(t *testing.T, imp Impairment, n int) (got []int, h *bridgeHarness) {
	t.Helper()
	h = newImpairedHarness(t, 64, 2048, false, 0, imp)
	frames := make([][]byte, n)
	g := &stream{s: 11}
	for i := range frames {
		f := make([]byte, testHdrLen+14+64+i%700)
		g.fill(f)
		binary.BigEndian.PutUint32(f[testHdrLen:], uint32(i))
		frames[i] = f
	}
	go func() {
		for _, f := range frames {
			if _, err := retry(func() (int, error) { return unix.Write(h.peer, f) }); err != nil {
				return
			}
		}
	}()
	// Until a quiet half second after the last frame could have come.
	tv := unix.NsecToTimeval((500 * time.Millisecond).Nanoseconds())
	unix.SetsockoptTimeval(h.peer, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 4096)
	for {
		k, err := retry(func() (int, error) { return unix.Read(h.peer, buf) })
		if err != nil {
			break
		}
		i := int(binary.BigEndian.Uint32(buf[testHdrLen:]))
		if i >= n || !bytes.Equal(buf[testHdrLen:k], frames[i][testHdrLen:]) {
			t.Fatalf("echo of frame %d: %d bytes, not what was sent", i, k)
		}
		got = append(got, i)
	}
	return got, h
}

// TestBridgeImpairment: the damage is what was asked, both ways, and what
// comes back is the frames sent, whole: every loss, duplicate and
// reordering the counters report is seen by the receiver, at about the
// rates asked, and the same seed damages the same frames of the same
// traffic again.
func TestBridgeImpairment(t *testing.T) {
	imp := Impairment{Loss: 0.01, Reorder: 0.01, Duplicate: 0.005, Seed: 42}
	const n = 6000
	got, h := impairRun(t, imp, n)
	tx, rx := &h.stats.Impaired[0], &h.stats.Impaired[1]
	if tx.Frames.Load() != n {
		t.Fatalf("guest→device: %d frames drawn, want %d", tx.Frames.Load(), n)
	}
	delivered := n - tx.Lost.Load() + tx.Duplicated.Load()
	if rx.Frames.Load() != delivered {
		t.Errorf("device→guest: %d frames drawn, want the %d that reached the device", rx.Frames.Load(), delivered)
	}
	if want := delivered - rx.Lost.Load() + rx.Duplicated.Load(); uint64(len(got)) != want {
		t.Errorf("%d echoes, want %d", len(got), want)
	}
	seen := map[int]int{}
	late := 0
	for k, i := range got {
		seen[i]++
		if k > 0 && i < got[k-1] {
			late++
		}
	}
	missing, dups := 0, 0
	for i := 0; i < n; i++ {
		switch c := seen[i]; {
		case c == 0:
			missing++
		case c > 1:
			dups += c - 1
		}
	}
	if uint64(missing) > tx.Lost.Load()+rx.Lost.Load() || missing == 0 {
		t.Errorf("%d frames never came back; %d+%d were lost", missing, tx.Lost.Load(), rx.Lost.Load())
	}
	if dups == 0 || late == 0 {
		t.Errorf("duplicates seen %d, frames out of order %d: the damage did not reach the receiver", dups, late)
	}
	for _, c := range []struct {
		what string
		got  uint64
		rate float64
	}{{"lost", tx.Lost.Load() + rx.Lost.Load(), imp.Loss}, {"reordered", tx.Reordered.Load() + rx.Reordered.Load(), imp.Reorder},
		{"duplicated", tx.Duplicated.Load() + rx.Duplicated.Load(), imp.Duplicate}} {
		if r := float64(c.got) / float64(2*n); r < c.rate/2 || r > c.rate*2 {
			t.Errorf("%s: %.4f of frames each way, asked %.4f", c.what, r, c.rate)
		}
	}
	t.Logf("%d frames: %d echoes, %d missing, %d duplicates, %d out of order; counters tx lost %d dup %d reord %d, rx lost %d dup %d reord %d",
		n, len(got), missing, dups, late, tx.Lost.Load(), tx.Duplicated.Load(), tx.Reordered.Load(),
		rx.Lost.Load(), rx.Duplicated.Load(), rx.Reordered.Load())

	// The guest's frames reach the bridge in one order every time, so the
	// same seed damages the same ones; what the device returns is in an
	// order timing decides, so only the amount of damage repeats there.
	_, h2 := impairRun(t, imp, n)
	tx2 := &h2.stats.Impaired[0]
	if a, b := []uint64{tx.Lost.Load(), tx.Duplicated.Load(), tx.Reordered.Load()},
		[]uint64{tx2.Lost.Load(), tx2.Duplicated.Load(), tx2.Reordered.Load()}; !slices.Equal(a, b) {
		t.Errorf("the same seed damaged the guest's frames differently: lost, duplicated, reordered %v then %v", a, b)
	}
}
