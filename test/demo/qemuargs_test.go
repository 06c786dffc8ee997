package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseQEMUArgs(t *testing.T) {
	out := "-m 256M \\\n-object memory-backend-memfd,id=vunet0-mem,size=256M,share=on \\\n-chardev socket,id=vunet0,path=/tmp/d/vunet.sock,reconnect=1 \\\n-device virtio-net-pci,netdev=vunet0,vectors=0\n"
	got, err := parseQEMUArgs(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-m", "256M", "-object", "memory-backend-memfd,id=vunet0-mem,size=256M,share=on",
		"-chardev", "socket,id=vunet0,path=/tmp/d/vunet.sock,reconnect=1", "-device", "virtio-net-pci,netdev=vunet0,vectors=0"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	noROM, err := withoutOptionROM(got)
	if err != nil {
		t.Fatal(err)
	}
	if noROM[7] != "virtio-net-pci,netdev=vunet0,vectors=0,romfile=" || got[7] != want[7] {
		t.Errorf("device %q (input %q): want romfile= appended to a copy", noROM[7], got[7])
	}
	for _, bad := range []string{"", "-chardev 'socket,path=/tmp/a b'\n", "-x a\\ b\n"} {
		if _, err := parseQEMUArgs(bad); err == nil {
			t.Errorf("parseQEMUArgs(%q) accepted", bad)
		}
	}
	if _, err := withoutOptionROM([]string{"-m", "1G"}); err == nil || !strings.Contains(err.Error(), "virtio-net-pci") {
		t.Errorf("withoutOptionROM without a NIC: %v", err)
	}
}
