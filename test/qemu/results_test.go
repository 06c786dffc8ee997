package qemu

import (
	"testing"

	"vunet/test/guest"
)

// A result line still being written (no newline yet) is not a result: the
// UART delivers the agent's line a few characters at a time.
func TestParseResultsSkipsUnfinishedLine(t *testing.T) {
	full := guest.Result{Name: "rr", OK: true, Fields: map[string]string{"ms": "2000", "p50_us": "310", "p99_us": "900"}}.Format()
	done := guest.Result{Name: "dhcp", OK: true, Fields: map[string]string{"ms": "12"}}.Format()
	for _, cut := range []int{len(full) - 1, len(full) - len(" p50_us=310 p99_us=900"), len("VUNET-RESULT name=rr ok=1 ms=")} {
		rs, errs := parseResults([]byte("boot noise\n" + done + "\n" + full[:cut]))
		if len(errs) != 0 || len(rs) != 1 || rs[0].Name != "dhcp" {
			t.Fatalf("cut at %d: results %v, errors %v; want only the finished dhcp line", cut, rs, errs)
		}
	}
	rs, errs := parseResults([]byte(done + "\n" + full + "\n"))
	if len(errs) != 0 || len(rs) != 2 || rs[1].Fields["p99_us"] != "900" {
		t.Fatalf("finished lines: results %v, errors %v", rs, errs)
	}
}
