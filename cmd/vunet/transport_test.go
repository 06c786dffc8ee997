package main

import (
	"bytes"
	"strings"
	"testing"

	"vunet/test/callers"
)

// TestTransportChoice: the transport is the last of --transport and
// --vhost-user; without either, passt's rule (invoked as passt: stream).
// What the stream transport cannot do is refused with the reason.
func TestTransportChoice(t *testing.T) {
	passt, vunet := programOf("/usr/libexec/passt"), programOf("/usr/bin/vunet")
	for _, tc := range []struct {
		p    program
		args []string
		want string // transport, or "error: <text in it>"
	}{
		{vunet, nil, transportVhostUser},
		{passt, nil, transportStream},
		{passt, []string{"--vhost-user"}, transportVhostUser},
		{vunet, []string{"--transport", "stream"}, transportStream},
		{passt, []string{"--transport", "vhost-user"}, transportVhostUser},
		{vunet, []string{"--vhost-user", "--transport", "stream"}, transportStream},
		{vunet, []string{"--transport", "stream", "--vhost-user"}, transportVhostUser},
		{passt, []string{"--fd", "3"}, transportStream},
		{vunet, []string{"--transport", "udp"}, "error: want vhost-user or stream"},
		{passt, []string{"--connect", "/tmp/q.sock"}, "error: --connect: the stream transport serves"},
		{vunet, []string{"--transport", "stream", "--queues", "2"}, "error: --queues 2: the stream transport carries one queue"},
		{passt, []string{"--migrate-to", "/tmp/m.sock"}, "error: need the vhost-user transport"},
		{passt, []string{"--repair-path", "/tmp/r.sock"}, "error: need the vhost-user transport"},
	} {
		args := tc.args
		if !strings.Contains(strings.Join(args, " "), "--fd") && !strings.Contains(strings.Join(args, " "), "--connect") {
			args = append([]string{"--socket", "/tmp/s.sock"}, args...)
		}
		o, err := parseFlags(args, &bytes.Buffer{})
		if err == nil {
			err = o.resolveTransport(tc.p)
		}
		switch {
		case strings.HasPrefix(tc.want, "error: "):
			if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(tc.want, "error: ")) {
				t.Errorf("%s %q: %v, want %s", tc.p.name, args, err, tc.want)
			}
		case err != nil:
			t.Errorf("%s %q: %v", tc.p.name, args, err)
		case o.transport != tc.want:
			t.Errorf("%s %q: transport %q, want %q", tc.p.name, args, o.transport, tc.want)
		}
	}
}

// TestTransportOfCallers: libvirt 9.0.0's command line (no --vhost-user)
// gets the stream transport, as passt would serve it; libvirt 11.3.0's
// and QEMU 10.1's with vhost-user=on get vhost-user, and QEMU's without
// it the stream over --fd.
func TestTransportOfCallers(t *testing.T) {
	n := callers.LibvirtNet{Socket: "/run/p.sock", PIDFile: "/run/p.pid", MAC: "52:54:00:12:34:56"}
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"libvirt 9.0.0", callers.Libvirt90(n), transportStream},
		{"libvirt 11.3.0 type=user", callers.Libvirt113(n), transportStream},
		{"libvirt 11.3.0 type=vhostuser", callers.Libvirt113(callers.LibvirtNet{VhostUser: true, Socket: "/s", PIDFile: "/p"}), transportVhostUser},
		{"QEMU 10.1 vhost-user=on", callers.QEMU101(callers.QEMUPasst{VhostUser: true}, "/p"), transportVhostUser},
		{"QEMU 10.1", callers.QEMU101(callers.QEMUPasst{}, "/p"), transportStream},
	} {
		o, err := parseFlags(tc.argv[1:], &bytes.Buffer{})
		if err == nil {
			err = o.resolveTransport(programOf(tc.argv[0]))
		}
		if err != nil || o.transport != tc.want {
			t.Errorf("%s %q: %v, transport %q, want %q", tc.name, tc.argv, err, o.transport, tc.want)
		}
	}
}

// TestQEMUArgsStream: qemu-args prints the -netdev stream that dials the
// socket, with the reconnect spelling of the QEMU release (none before
// 8.0), and refuses a libvirt XML for it.
func TestQEMUArgsStream(t *testing.T) {
	for _, tc := range []struct {
		version, want string
	}{
		{"7.2", "-m 1G \\\n-netdev stream,id=vunet0,server=off,addr.type=unix,addr.path=/run/a,,b.sock \\\n-device virtio-net-pci,netdev=vunet0,mac=52:54:00:00:00:01\n"},
		{"8.2", "-m 1G \\\n-netdev stream,id=vunet0,server=off,addr.type=unix,addr.path=/run/a,,b.sock,reconnect=1 \\\n-device virtio-net-pci,netdev=vunet0,mac=52:54:00:00:00:01\n"},
		{"10.1", "-m 1G \\\n-netdev stream,id=vunet0,server=off,addr.type=unix,addr.path=/run/a,,b.sock,reconnect-ms=1000 \\\n-device virtio-net-pci,netdev=vunet0,mac=52:54:00:00:00:01\n"},
	} {
		var out, errb bytes.Buffer
		args := []string{"qemu-args", "--transport", "stream", "-s", "/run/a,b.sock", "--guest-mac", "52:54:00:00:00:01", "--qemu-version", tc.version}
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.version, code, errb.String())
		}
		if out.String() != tc.want || errb.Len() != 0 {
			t.Errorf("QEMU %s:\n%s\nwant\n%s(stderr %q)", tc.version, out.String(), tc.want, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"libvirt-xml", "--transport", "stream", "-s", "/s"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "backend type='passt'") {
		t.Errorf("libvirt-xml for the stream: exit %d, %q", code, errb.String())
	}
}

// TestPrintQEMUArgs: --print-qemu-args prints what qemu-args --tcg prints
// for the socket, ids included, for either transport.
func TestPrintQEMUArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--socket", "/run/v.sock"}, "-m 1G -object memory-backend-memfd,id=vunet0-mem,size=1G,share=on -numa node,memdev=vunet0-mem " +
			"-chardev socket,id=vunet0,path=/run/v.sock,reconnect=1 -netdev vhost-user,id=vunet0,chardev=vunet0 -device virtio-net-pci,netdev=vunet0,vectors=0"},
		{[]string{"--socket", "/run/v.sock", "--transport", "stream"}, "-m 1G -netdev stream,id=vunet0,server=off,addr.type=unix,addr.path=/run/v.sock " +
			"-device virtio-net-pci,netdev=vunet0"},
	} {
		o, err := parseFlags(tc.args, &bytes.Buffer{})
		if err == nil {
			err = o.resolveTransport(programOf("vunet"))
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := printedQEMUArgs(o, qemuVersion{7, 2}); got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.args, got, tc.want)
		}
	}
}
