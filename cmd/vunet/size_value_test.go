package main

import (
	"strings"
	"testing"
)

func TestSizeValue(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		err  string
	}{
		{in: "4096", want: 4096},
		{in: "512G", want: 512 << 30},
		{in: "2T", want: 2 << 40},
		{in: "1tib", want: 1 << 40},
		{in: "64MB", want: 64 << 20},
		{in: "3k", want: 3 << 10},
		{in: "0", err: "positive size"},
		{in: "-1G", err: "positive size"},
		{in: "G", err: "positive size"},
		{in: "1.5T", err: "positive size"},
		{in: "16777216T", err: "too large"},
	} {
		var v sizeValue
		err := v.Set(c.in)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Set(%q) = %v, want an error with %q", c.in, err, c.err)
			}
		case err != nil:
			t.Errorf("Set(%q): %v", c.in, err)
		case uint64(v) != c.want:
			t.Errorf("Set(%q) = %d, want %d", c.in, uint64(v), c.want)
		}
	}
	v := sizeValue(2 << 40)
	if v.String() != "2T" {
		t.Errorf("String() = %q, want 2T", v.String())
	}
}

// TestMaxGuestMemoryFlag: the flag parses sizes and names itself in errors.
func TestMaxGuestMemoryFlag(t *testing.T) {
	o, err := parseFlags([]string{"--socket", "/tmp/x.sock", "--max-guest-memory", "256G"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(o.maxGuestMemory) != 256<<30 {
		t.Fatalf("maxGuestMemory = %d", uint64(o.maxGuestMemory))
	}
	if _, err := parseFlags([]string{"--socket", "/tmp/x.sock", "--max-guest-memory", "lots"}, nil); err == nil ||
		!strings.Contains(err.Error(), "--max-guest-memory") {
		t.Fatalf("bad size: %v", err)
	}
}
