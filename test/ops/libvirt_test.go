package ops

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
	"vunet/test/testenv"
)

// TestLibvirtDomainOnVunet boots the test guest as a libvirt domain whose
// network interface, shared memory and TCG workaround come from
// `vunet libvirt-xml --tcg --domain`: libvirt's QEMU (running as
// libvirt-qemu, mode='client') connects to vunet's listening socket, the
// guest takes a DHCP lease from vunet and downloads a blob from a server on
// the host's loopback through the gateway address. The agent's result lines
// come from a <serial type='file'> the domain writes.
func TestLibvirtDomainOnVunet(t *testing.T) {
	testenv.SkipIfShort(t)
	testenv.NeedRoot(t, "libvirtd runs as root, and a network namespace for the daemon")
	qemu.NeedQEMU(t)
	virsh := needLibvirtd(t)
	qemuUser, err := user.Lookup("libvirt-qemu")
	if err != nil {
		testenv.Unavailable(t, fmt.Errorf("user libvirt-qemu: %w", err), libvirtHint)
	}

	// README's libvirt walk-through, by hand: the socket (0666) in a
	// directory only root and group kvm may enter, libvirt-qemu being in
	// kvm. The kernel, initrd and serial files live here too (the test's
	// usual work directory is 0700 and the image cache sits under root's
	// home).
	dir := qemu.WorkDir(t)
	kvm, err := user.LookupGroup("kvm")
	if err != nil {
		testenv.Unavailable(t, fmt.Errorf("group kvm: %w", err), libvirtHint)
	}
	kvmGID, _ := strconv.Atoi(kvm.Gid)
	if err := os.Chown(dir, 0, kvmGID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	img := qemu.GuestImage(t)
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.gz")
	copyFile(t, img.Kernel, kernel)
	copyFile(t, img.Initrd, initrd)
	console, results := filepath.Join(dir, "console.log"), filepath.Join(dir, "results.log")

	ns := qemu.NewNetNS(t)
	page := startPageServer(t, ns, 4<<20)
	// mode='client': QEMU dials vunet, so vunet listens, and its socket must
	// be connectable by libvirt-qemu.
	d := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Dir: dir, Args: []string{"--socket-mode", "0666"}})

	name := fmt.Sprintf("vunet-ops-%d", os.Getpid())
	dom := testDomain{Name: name, Path: filepath.Join(dir, "dom.xml"), Console: console, Results: results,
		Logs: map[string]string{"libvirt's QEMU log": qemuLog(name)}}
	dom.XML = libvirtDomain(t, name, d.Socket, kernel, initrd, fetchCmdline(ns, page), console, results)
	virshSystem := func(ctx context.Context, args ...string) (string, error) { return virshRun(ctx, virsh, args...) }
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	started := time.Now()
	dom.create(t, ctx, virshSystem)

	// The front-end that connected is libvirt's QEMU, running as libvirt-qemu.
	conn, err := d.Log.Wait(30*time.Second, "front-end connected", qemu.MsgIs("vhost-user front-end connected"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := conn.Attr("uid"); uid != qemuUser.Uid {
		t.Errorf("front-end connected as uid %s, want libvirt-qemu (%s)", uid, qemuUser.Uid)
	}

	byName := dom.guestResults(t, ctx)
	if l := byName[guest.CheckDHCP]; l.Fields["router"] != ns.Host.Gateway.String() || l.Fields["ip"] != ns.Host.Addr.String() {
		t.Errorf("lease %v: want %s via %s (the namespace's host address and gateway, as vunet hands them out)", l.Fields, ns.Host.Addr, ns.Host.Gateway)
	}
	page.checkFetched(t, byName[guest.CheckHTTP].Fields)

	// The guest powered off (ACPI): libvirt ends and forgets the transient
	// domain.
	waitDomainGone(t, virshSystem, name)
	t.Logf("domain %s: created, booted, fetched %d bytes through vunet and shut off in %v", name, page.Size, time.Since(started).Round(time.Millisecond))
}

// waitDomainGone waits up to 20 s for the transient domain name, whose
// guest powered off, to be ended and forgotten by libvirt; virsh runs
// one virsh command against the daemon.
func waitDomainGone(t *testing.T, virsh virshFunc, name string) {
	t.Helper()
	gone := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		state, err := virsh(ctx, "domstate", name)
		cancel()
		if err != nil && strings.Contains(err.Error(), "failed to get domain") {
			return
		}
		if time.Now().After(gone) {
			t.Errorf("domain %s still there 20s after the guest powered off: %s %v", name, strings.TrimSpace(state), err)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// libvirtDomain builds the domain XML: vunet's own (vunetDomain) made
// bootable by the test (bootableDomain).
func libvirtDomain(t *testing.T, name, socket, kernel, initrd, cmdline, console, results string) string {
	t.Helper()
	return bootableDomain(t, vunetDomain(t, name, socket), kernel, initrd, cmdline, console, results)
}

// vunetDomain is `vunet libvirt-xml --tcg --domain NAME` for socket: memfd
// shared memory, the vhost-user interface (alias ua-vunet0), the vectors=0
// override.
func vunetDomain(t *testing.T, name, socket string) string {
	t.Helper()
	out, err := exec.Command(qemu.DaemonBinary(t), "libvirt-xml", "--socket", socket, "--tcg", "--mem", "256M",
		"--guest-mac-addr", qemu.DefaultMAC, "--domain", name).Output()
	if err != nil {
		t.Fatalf("vunet libvirt-xml: %v", err)
	}
	dom := string(out)
	for _, want := range []string{"mode='client'", "<source type='memfd'/>", "<access mode='shared'/>", "name='vectors'", "value='0'"} {
		if !strings.Contains(dom, want) {
			t.Errorf("vunet libvirt-xml --tcg --domain lacks %s:\n%s", want, dom)
		}
	}
	return dom
}

// xmlEscape escapes s for an XML attribute or text.
func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// bootableDomain adds to dom what only a test knows: direct kernel boot,
// the two serial files, no option ROM on the interface, and power-off
// ending the domain.
func bootableDomain(t *testing.T, dom, kernel, initrd, cmdline, console, results string) string {
	t.Helper()
	insert := func(anchor, text string, before bool) {
		i := strings.Index(dom, anchor)
		if i < 0 {
			t.Fatalf("vunet libvirt-xml output has no %q to extend:\n%s", anchor, dom)
		}
		if !before {
			i += len(anchor)
		}
		dom = dom[:i] + text + dom[i:]
	}
	insert("hvm</type>", fmt.Sprintf("\n    <kernel>%s</kernel>\n    <initrd>%s</initrd>\n    <cmdline>%s</cmdline>",
		xmlEscape(kernel), xmlEscape(initrd), xmlEscape(cmdline)), false)
	// ACPI, so that the agent's power-off ends the domain (libvirt starts
	// QEMU without it unless asked).
	insert("<devices>", "<features><acpi/></features>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>destroy</on_reboot>\n  <on_crash>destroy</on_crash>\n  ", true)
	insert("</interface>", "  <rom enabled='no'/>\n    ", true)
	insert("</devices>", fmt.Sprintf(`  <serial type='file'>
      <source path='%s'/>
      <target port='0'/>
    </serial>
    <serial type='file'>
      <source path='%s'/>
      <target port='1'/>
    </serial>
  `, xmlEscape(console), xmlEscape(results)), true)
	return dom
}

// waitResults reads the agent's result file until result last appears or
// ctx ends, returning every result seen.
func waitResults(ctx context.Context, path, last string) ([]guest.Result, error) {
	for {
		var res []guest.Result
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			r, err := guest.ParseResult(line)
			if err != nil {
				continue // console noise, or a line still being written
			}
			res = append(res, r)
			if r.Name == last {
				return res, nil
			}
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("no %q result in %s: %w", last, path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// qemuLog is where libvirt keeps a domain's QEMU command line and stderr.
func qemuLog(name string) string { return "/var/log/libvirt/qemu/" + name + ".log" }

// copyFile copies src to dst, readable by everyone.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
