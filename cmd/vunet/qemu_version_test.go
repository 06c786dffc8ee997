package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// stubQEMU replaces the QEMU version detection for one test.
func stubQEMU(t *testing.T, v qemuVersion, err error) {
	t.Helper()
	old := detectQEMUVersion
	detectQEMUVersion = func() (qemuVersion, error) { return v, err }
	t.Cleanup(func() { detectQEMUVersion = old })
}

func TestParseQEMUVersion(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want qemuVersion
	}{
		{"QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)\nCopyright (c) 2003-2022 Fabrice Bellard and the QEMU Project developers\n", qemuVersion{7, 2}},
		{"QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1.4)\n", qemuVersion{8, 2}},
		{"QEMU emulator version 9.1.3\n", qemuVersion{9, 1}},
		{"QEMU emulator version 9.2.0\n", qemuVersion{9, 2}},
		{"QEMU emulator version 10.1.50 (v10.1.0-1234-gdeadbeef)\n", qemuVersion{10, 1}},
		{"warning: something first\nQEMU emulator version 11.0.0\n", qemuVersion{11, 0}},
	} {
		got, err := parseQEMUVersion(tc.out)
		if err != nil || got != tc.want {
			t.Errorf("%q: %v %v, want %v", firstLine(tc.out), got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "qemu-system-x86_64: command not found", "QEMU emulator version x.y", "QEMU emulator version 99999999999999999999.1"} {
		if v, err := parseQEMUVersion(bad); err == nil {
			t.Errorf("%q: parsed as %v", bad, v)
		}
	}
	for _, tc := range []struct {
		v           qemuVersion
		reconnectMS bool
	}{{qemuVersion{7, 2}, false}, {qemuVersion{9, 1}, false}, {qemuVersion{9, 2}, true}, {qemuVersion{10, 0}, true}, {qemuVersion{10, 2}, true}} {
		if got := tc.v.reconnectMS(); got != tc.reconnectMS {
			t.Errorf("%v: reconnect-ms %v, want %v", tc.v, got, tc.reconnectMS)
		}
	}
}

// TestQEMUArgsReconnectSpelling: qemu-args spells the chardev's reconnect
// interval for the QEMU at hand, --qemu-version overriding, and falls back
// to QEMU 7.2's spelling, with a note, when there is no QEMU to ask.
func TestQEMUArgsReconnectSpelling(t *testing.T) {
	chardev := func(args ...string) (string, string) {
		var out, errb bytes.Buffer
		if code := run(append([]string{"qemu-args", "-s", "/s", "--tcg"}, args...), &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errb.String())
		}
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "-chardev ") {
				return strings.TrimSuffix(l, " \\"), errb.String()
			}
		}
		t.Fatalf("no -chardev in %q", out.String())
		return "", ""
	}
	stubQEMU(t, qemuVersion{9, 2}, nil)
	if c, _ := chardev(); c != "-chardev socket,id=vunet0,path=/s,reconnect-ms=1000" {
		t.Errorf("QEMU 9.2: %s", c)
	}
	if c, _ := chardev("--qemu-version", "7.2"); c != "-chardev socket,id=vunet0,path=/s,reconnect=1" {
		t.Errorf("--qemu-version 7.2: %s", c)
	}
	stubQEMU(t, qemuVersion{9, 1}, nil)
	if c, _ := chardev(); c != "-chardev socket,id=vunet0,path=/s,reconnect=1" {
		t.Errorf("QEMU 9.1: %s", c)
	}
	if c, _ := chardev("--qemu-version", "10.1.0"); c != "-chardev socket,id=vunet0,path=/s,reconnect-ms=1000" {
		t.Errorf("--qemu-version 10.1.0: %s", c)
	}
	stubQEMU(t, qemuVersion{}, errors.New(`exec: "qemu-system-x86_64": executable file not found in $PATH`))
	c, note := chardev()
	if c != "-chardev socket,id=vunet0,path=/s,reconnect=1" || !strings.Contains(note, "assuming QEMU 7.2") || strings.Count(note, "\n") != 1 {
		t.Errorf("no QEMU: %s, note %q", c, note)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"qemu-args", "-s", "/s", "--qemu-version", "ten"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--qemu-version") {
		t.Errorf("bad --qemu-version: exit %d %q", code, errb.String())
	}
}
