package ops

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"vunet/test/dpdk"
	"vunet/test/qemu"
	"vunet/test/testenv"
)

// readmeLibvirt returns README's libvirt section and its XML blocks: the
// whole domain first, then the hugepages <memoryBacking>.
func readmeLibvirt(t *testing.T) (section string, blocks []string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## libvirt\n")
	if !ok {
		t.Fatal(`README has no "## libvirt" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, m := range regexp.MustCompile("(?s)```xml\n(.*?)```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) != 2 || !strings.HasPrefix(blocks[0], "<domain") || !strings.Contains(blocks[1], "<hugepages>") {
		t.Fatalf("README's libvirt section: want the domain and the hugepages memoryBacking as xml blocks, found %d", len(blocks))
	}
	return section, blocks
}

// indentless drops each line's leading blanks, for comparing XML that sits
// at different depths.
func indentless(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		out = append(out, strings.TrimSpace(l))
	}
	return strings.Join(out, "\n")
}

// element returns the first <name …>…</name> of s.
func element(t *testing.T, s, name string) string {
	t.Helper()
	i := strings.Index(s, "<"+name)
	j := strings.Index(s, "</"+name+">")
	if i < 0 || j < i {
		t.Fatalf("no <%s> in:\n%s", name, s)
	}
	return s[i : j+len(name)+3]
}

// TestREADMELibvirtWalkthrough checks what README's libvirt walk-through
// shows against the tools it names: the domain validates against libvirt's
// schema, its <interface> is what `vunet libvirt-xml` prints, libvirt turns
// each memory set-up into the QEMU memory backend README says, and
// virt-aa-helper gives QEMU's AppArmor profile the socket path.
func TestREADMELibvirtWalkthrough(t *testing.T) {
	testenv.SkipIfShort(t)
	testenv.NeedRoot(t, "libvirt's embedded QEMU driver probes QEMU as root")
	validate := testenv.NeedTool(t, "virt-xml-validate", "", libvirtHint)
	virsh := testenv.NeedTool(t, "virsh", "", libvirtHint)
	qemu.NeedQEMU(t)
	_, blocks := readmeLibvirt(t)
	domain, hugepages := blocks[0], blocks[1]
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	domPath := write("vm1.xml", domain)
	if out, err := exec.Command(validate, domPath, "domain").CombinedOutput(); err != nil {
		t.Errorf("virt-xml-validate README's domain: %v\n%s", err, out)
	}

	out, err := exec.Command(qemu.DaemonBinary(t), "libvirt-xml", "--socket", "/run/vunet/vm1/vunet.sock", "--queues", "2").Output()
	if err != nil {
		t.Fatalf("vunet libvirt-xml: %v", err)
	}
	for _, el := range []string{"interface", "memoryBacking"} {
		if got, want := indentless(element(t, domain, el)), indentless(element(t, string(out), el)); got != want {
			t.Errorf("README's <%s>:\n%s\nvunet libvirt-xml prints:\n%s", el, got, want)
		}
	}

	// libvirt's own QEMU command line for each memory set-up, from its
	// embedded driver (no libvirtd; TCG, as KVM may be missing here).
	// libvirt refuses file-backed hugepages without a hugetlbfs mounted,
	// which a machine without systemd's dev-hugepages.mount lacks: mount
	// one for the test (no pages needed, the domain never starts).
	dpdk.EnsureHugepages(t, 0)
	argv := func(name, memoryBacking string) string {
		t.Helper()
		dom := strings.Replace(domain, "<domain type='kvm'>", "<domain type='qemu'>", 1)
		dom = strings.Replace(dom, element(t, dom, "memoryBacking"), memoryBacking, 1)
		p := write(name+".xml", dom)
		cmd := exec.Command(virsh, "-c", "qemu:///embed?root="+filepath.Join(dir, "libvirt"), "domxml-to-native", "qemu-argv", p)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("virsh domxml-to-native (%s): %v\n%s", name, err, out)
		}
		return string(out)
	}
	for _, tc := range []struct {
		name, memoryBacking string
		want                []string
	}{
		{"memfd", element(t, domain, "memoryBacking"), []string{`"qom-type":"memory-backend-memfd"`, `"share":true`}},
		{"hugepages-memfd", hugepages, []string{`"qom-type":"memory-backend-memfd"`, `"hugetlb":true`, `"share":true`, `"prealloc":true`}},
		{"hugepages-file", strings.Replace(hugepages, "<source type='memfd'/>", "", 1),
			[]string{`"qom-type":"memory-backend-file"`, `"mem-path":"/dev/hugepages/libvirt/qemu`, `"share":true`, `"prealloc":true`}},
	} {
		got := argv(tc.name, tc.memoryBacking)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: libvirt's QEMU command line lacks %s:\n%s", tc.name, w, got)
			}
		}
	}

	// AppArmor: the per-domain rules libvirt writes include the socket.
	aa := "/usr/lib/libvirt/virt-aa-helper"
	if _, err := os.Stat(aa); err != nil {
		testenv.Unavailable(t, err, libvirtHint)
	}
	withUUID := strings.Replace(domain, "<name>vm1</name>", "<name>vm1</name><uuid>6c3b1c1e-2f4e-4b1a-9d9e-0a1b2c3d4e5f</uuid>", 1)
	cmd := exec.Command(aa, "--dryrun", "-c", "-u", "libvirt-6c3b1c1e-2f4e-4b1a-9d9e-0a1b2c3d4e5f")
	cmd.Stdin = strings.NewReader(withUUID)
	aaOut, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("virt-aa-helper --dryrun: %v\n%s", err, aaOut)
	}
	if !strings.Contains(string(aaOut), `"/run/vunet/vm1/vunet.sock" rw,`) {
		t.Errorf("virt-aa-helper gives QEMU no rule for the socket:\n%s", aaOut)
	}
}
