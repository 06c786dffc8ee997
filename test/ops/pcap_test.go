package ops

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
	"vunet/test/testenv"
)

const tsharkHint = "apt-get install tshark"

// DHCP message types (option 53) of one lease, in order.
var dhcpExchange = []string{"1", "2", "3", "5"} // DISCOVER, OFFER, REQUEST, ACK

// TestPcapReadByTshark runs a guest that takes a DHCP lease and fetches a
// page over TCP through a vunet started with --pcap, and reads the capture
// with Wireshark's tshark: the whole DHCP exchange (DISCOVER, OFFER,
// REQUEST, ACK) and the TCP handshake (the guest's SYN to the gateway, the
// SYN-ACK vunet answered with) must be there, with the lease's addresses.
func TestPcapReadByTshark(t *testing.T) {
	testenv.SkipIfShort(t)
	testenv.NeedRoot(t, "network namespace for the daemon and its server")
	tshark := testenv.NeedTool(t, "tshark", "", tsharkHint)
	qemu.NeedQEMU(t)
	needPcapFlag(t)

	ns := qemu.NewNetNS(t)
	page := startPageServer(t, ns, 256<<10)
	capture := filepath.Join(qemu.WorkDir(t), "guest.pcap")
	d := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Args: []string{"--pcap", capture}})
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket:  d.Socket,
		Checks:  []string{guest.CheckLink, guest.CheckDHCP, guest.CheckHTTP},
		Params:  map[string]string{guest.ParamHTTP: fmt.Sprintf("http://%s:%d/page", ns.Host.Gateway, page.Port)},
		Timeout: 90 * time.Second,
	})
	lease := vm.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	r := vm.RequireResult(t, guest.CheckHTTP, 60*time.Second)
	page.checkFetched(t, r.Fields)
	vm.Finish(t)
	// The capture is complete once the daemon has closed it.
	if err := d.Stop(5 * time.Second); err != nil {
		t.Fatalf("daemon stop: %v", err)
	}
	st, err := os.Stat(capture)
	if err != nil || st.Size() <= 24 {
		t.Fatalf("vunet --pcap %s left no frames (%v, stat error %v): is --pcap wired to the capture writer?", capture, st, err)
	}

	guestIP, gw := lease.Fields["ip"], ns.Host.Gateway.String()
	// DHCP: message type, then the client and server addresses tshark decoded.
	rows := tsharkFields(t, tshark, capture, "dhcp", "dhcp.option.dhcp", "dhcp.ip.your", "dhcp.option.dhcp_server_id")
	var types []string
	for _, f := range rows {
		types = append(types, f[0])
		if (f[0] == "2" || f[0] == "5") && (f[1] != guestIP || f[2] != gw) {
			t.Errorf("DHCP %s offers %s from server %s, want %s from %s (the lease the guest reported)", f[0], f[1], f[2], guestIP, gw)
		}
	}
	if !subsequence(types, dhcpExchange) {
		t.Errorf("DHCP message types in the capture: %v, want DISCOVER, OFFER, REQUEST, ACK (%v) in that order", types, dhcpExchange)
	}

	// TCP handshake: the guest's SYN to the server port at the gateway and
	// vunet's SYN-ACK back, same ports.
	port := fmt.Sprint(page.Port)
	var syn, synack bool
	for _, f := range tsharkFields(t, tshark, capture, "tcp.flags.syn==1", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "tcp.flags.ack") {
		ack := f[4] == "1" || strings.EqualFold(f[4], "true")
		switch {
		case !ack && f[0] == guestIP && f[1] == gw && f[3] == port:
			syn = true
		case ack && f[0] == gw && f[1] == guestIP && f[2] == port:
			synack = true
		}
	}
	if !syn || !synack {
		t.Errorf("TCP handshake with %s:%s in the capture: SYN %v, SYN-ACK %v, want both", gw, port, syn, synack)
	}
	t.Logf("capture %s (%d bytes): DHCP %v, TCP SYN %v, SYN-ACK %v", capture, st.Size(), types, syn, synack)
}

// needPcapFlag fails the test with a clear message when the daemon has no
// --pcap option: this is the acceptance test for it.
func needPcapFlag(t *testing.T) {
	t.Helper()
	out, _ := exec.Command(qemu.DaemonBinary(t), "--help").CombinedOutput()
	if !strings.Contains(string(out), "--pcap") {
		t.Fatalf("vunet --help lists no --pcap option: the capture flag is not wired yet")
	}
}

// tsharkFields reads capture with display filter filter and returns the
// given fields of every matching frame.
func tsharkFields(t *testing.T, tshark, capture, filter string, fields ...string) [][]string {
	t.Helper()
	args := []string{"-r", capture, "-Y", filter, "-T", "fields", "-E", "separator=/t"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command(tshark, args...)
	// tshark wants a writable home for its profile; root's may not exist.
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("tshark %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		for len(f) < len(fields) {
			f = append(f, "")
		}
		rows = append(rows, f)
	}
	t.Logf("tshark -Y %q: %d frames", filter, len(rows))
	return rows
}

// subsequence reports whether want appears in got in order, not
// necessarily adjacent.
func subsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}
