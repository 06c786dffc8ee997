package guest

import (
	"errors"
	"testing"
)

func TestResultRoundTrip(t *testing.T) {
	in := Result{Name: "dhcp", OK: true, Fields: map[string]string{
		"ip": "10.0.2.15/24", "detail": `lease "x" = 3 s`, "ms": "120",
	}}
	line := "[    5.1] random kernel noise " + in.Format() + "\r\n"
	got, err := ParseResult(line)
	if err != nil {
		t.Fatalf("ParseResult(%q): %v", line, err)
	}
	if got.Name != "dhcp" || !got.OK || len(got.Fields) != 3 ||
		got.Fields["ip"] != "10.0.2.15/24" || got.Fields["detail"] != `lease "x" = 3 s` || got.Fields["ms"] != "120" {
		t.Fatalf("round trip: got %+v from %q", got, line)
	}
	want := `VUNET-RESULT name=dhcp ok=1 detail="lease \"x\" = 3 s" ip=10.0.2.15/24 ms=120`
	if s := in.Format(); s != want {
		t.Fatalf("Format = %q, want %q", s, want)
	}
}

func TestParseResultRejects(t *testing.T) {
	for _, line := range []string{
		"VUNET-RESULT ",
		"VUNET-RESULT name=x",
		"VUNET-RESULT ok=1",
		"VUNET-RESULT name=x ok=2",
		`VUNET-RESULT name=x ok=1 detail="unterminated`,
		`VUNET-RESULT name=x ok=1 detail="a"b`,
		"VUNET-RESULT name=x ok=1 =v",
		"VUNET-RESULT name=x ok=1 novalue",
		`VUNET-RESULT name="" ok=1`,
	} {
		if r, err := ParseResult(line); err == nil || errors.Is(err, ErrNoResult) {
			t.Errorf("ParseResult(%q) = %+v, %v; want a parse error", line, r, err)
		}
	}
	if _, err := ParseResult("plain console line"); !errors.Is(err, ErrNoResult) {
		t.Errorf("plain line: err %v, want ErrNoResult", err)
	}
}

func FuzzParseResult(f *testing.F) {
	f.Add("VUNET-RESULT name=link ok=1 tx_packets=12 detail=\"eth0 up\"")
	f.Add(`xx VUNET-RESULT name=a ok=0 k="\x00\u1234" z=`)
	f.Add("VUNET-RESULT name=done ok=1 checks=2 failed=0\r")
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseResult(line)
		if err != nil {
			return
		}
		// Whatever parsed must survive its own formatting.
		again, err := ParseResult(r.Format())
		if err != nil {
			t.Fatalf("reparse of %q: %v", r.Format(), err)
		}
		if again.Name != r.Name || again.OK != r.OK {
			t.Fatalf("reparse changed %+v into %+v", r, again)
		}
		for k, v := range r.Fields {
			if isToken(k) && again.Fields[k] != v {
				t.Fatalf("field %s: %q became %q", k, v, again.Fields[k])
			}
		}
	})
}
