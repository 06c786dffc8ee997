package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestQEMUArgsOutput(t *testing.T) {
	stubQEMU(t, qemuVersion{7, 2}, nil)
	tests := []struct {
		args []string
		want string
		note bool // the TCG note on stderr
	}{
		{[]string{"-s", "/run/vunet.sock"}, `-m 1G \
-object memory-backend-memfd,id=vunet0-mem,size=1G,share=on \
-numa node,memdev=vunet0-mem \
-chardev socket,id=vunet0,path=/run/vunet.sock,reconnect=1 \
-netdev vhost-user,id=vunet0,chardev=vunet0 \
-device virtio-net-pci,netdev=vunet0
`, true},
		{[]string{"--socket", "/run/a,b.sock", "--queues", "4", "--mem", "2G", "--guest-mac", "52:54:00:00:00:01"}, `-m 2G \
-object memory-backend-memfd,id=vunet0-mem,size=2G,share=on \
-numa node,memdev=vunet0-mem \
-chardev socket,id=vunet0,path=/run/a,,b.sock,reconnect=1 \
-netdev vhost-user,id=vunet0,chardev=vunet0,queues=4 \
-device virtio-net-pci,netdev=vunet0,mq=on,vectors=10,mac=52:54:00:00:00:01
`, true},
		{[]string{"--connect", "/tmp/my vm.sock", "--tcg", "--queues", "2", "--id", "n1", "--mem", "512M"}, `-m 512M \
-object memory-backend-memfd,id=n1-mem,size=512M,share=on \
-numa node,memdev=n1-mem \
-chardev 'socket,id=n1,path=/tmp/my vm.sock,server=on,wait=off' \
-netdev vhost-user,id=n1,chardev=n1,queues=2 \
-device virtio-net-pci,netdev=n1,mq=on,vectors=0
`, false},
		// Daemon flags are accepted, so the daemon's command line works.
		{[]string{"--vhost-user", "-s", "/s", "-t", "22", "-a", "10.0.0.2", "--tcg"}, `-m 1G \
-object memory-backend-memfd,id=vunet0-mem,size=1G,share=on \
-numa node,memdev=vunet0-mem \
-chardev socket,id=vunet0,path=/s,reconnect=1 \
-netdev vhost-user,id=vunet0,chardev=vunet0 \
-device virtio-net-pci,netdev=vunet0,vectors=0
`, false},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		if code := run(append([]string{"qemu-args"}, tt.args...), &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d: %s", tt.args, code, errb.String())
		}
		if out.String() != tt.want {
			t.Errorf("%q:\n%s\nwant\n%s", tt.args, out.String(), tt.want)
		}
		if got := strings.Contains(errb.String(), "vectors=0"); got != tt.note {
			t.Errorf("%q: TCG note %v, want %v (%q)", tt.args, got, tt.note, errb.String())
		}
	}
}

func TestLibvirtXMLOutput(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"libvirt-xml", "-s", "/run/vunet/vm1.sock", "--tcg", "--queues", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := `<!-- inside <domain> -->
<!-- vhost-user needs the guest RAM shared with the back-end -->
<memoryBacking>
  <source type='memfd'/>
  <access mode='shared'/>
</memoryBacking>
<!-- inside <devices> -->
<interface type='vhostuser'>
  <source type='unix' path='/run/vunet/vm1.sock' mode='client'>
    <reconnect enabled='yes' timeout='2'/>
  </source>
  <model type='virtio'/>
  <driver queues='2'/>
  <alias name='ua-vunet0'/>
</interface>
<!-- inside <domain>, which declares xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' -->
<!-- QEMU 7.2 under TCG crashes with MSI-X and vhost-user: legacy INTx (vectors=0) -->
<qemu:override>
  <qemu:device alias='ua-vunet0'>
    <qemu:frontend>
      <qemu:property name='vectors' type='unsigned' value='0'/>
    </qemu:frontend>
  </qemu:device>
</qemu:override>
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}

	out.Reset()
	run([]string{"libvirt-xml", "--connect", "/q'.sock", "--guest-mac", "52:54:00:AB:00:01"}, &out, &errb)
	for _, s := range []string{"<source type='unix' path='/q&apos;.sock' mode='server'/>", "<mac address='52:54:00:ab:00:01'/>"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("client-mode XML lacks %q:\n%s", s, out.String())
		}
	}
	if strings.Contains(out.String(), "qemu:override") || strings.Contains(out.String(), "reconnect") {
		t.Errorf("client-mode XML without --tcg has override or reconnect:\n%s", out.String())
	}
}

func TestHelperErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"qemu-args"}, "--socket PATH (or --connect PATH) is required"},
		{[]string{"qemu-args", "-s", "a", "--mem", "lots"}, "--mem"},
		{[]string{"qemu-args", "-s", "a", "--queues", "0"}, "--queues 0"},
		{[]string{"qemu-args", "-s", "a", "--id", "1x"}, "--id"},
		{[]string{"qemu-args", "-s", "a", "--domain", "x"}, "unknown flag --domain"},
		{[]string{"libvirt-xml", "-s", "a", "--guest-mac-addr", "zz"}, "--guest-mac-addr"},
		{[]string{"libvirt-xml", "-s", "a", "--bogus"}, "unknown flag --bogus"},
		{[]string{"libvirt-xml", "-s", "a", "extra"}, `"extra"`},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(tt.args, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), tt.want) || strings.Count(errb.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%q: exit %d stderr %q stdout %q, want exit 1 and one line containing %q", tt.args, code, errb.String(), out.String(), tt.want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"libvirt-xml", "--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "--domain NAME") {
		t.Errorf("libvirt-xml --help: exit %d out %q", code, out.String())
	}
}
