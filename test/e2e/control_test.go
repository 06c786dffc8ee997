package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/cmd/vunet/control"
	"vunet/test/guest"
	"vunet/test/qemu"
)

// TestQEMURuntimeForwards changes the forwards of a daemon whose guest
// runs, with vunet ctl on its --control socket: a TCP forward added, used
// from the host (bytes echoed by the guest), removed (the port refuses
// connections); the same for UDP (a datagram echoed, then the port
// refused); vunet ctl status shows the guest's address (offered and
// leased, and seen in its traffic) and its TCP flow while one is open. The
// daemon runs sandboxed (as nobody): a port below
// net.ipv4.ip_unprivileged_port_start is refused with a message that
// says why, and nothing the control endpoint does is refused by the
// system-call filter (the suite checks every daemon's log for that).
func TestQEMURuntimeForwards(t *testing.T) {
	qemu.NeedQEMU(t)
	needFlag(t, "--control")
	ns := qemu.NewNetNS(t)
	ctlPath := filepath.Join(qemu.WorkDir(t), "control.sock")
	d := netDaemon(t, ns, "--control", ctlPath)
	const guestPort, tcpPort, udpPort = 7070, 17070, 17071
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckEchoServe},
		Params: map[string]string{guest.ParamEchoServe: fmt.Sprintf("%d,240s", guestPort), guest.ParamTimeout: "300s"},
	})
	lease := vm.RequireResult(t, guest.CheckDHCP, 120*time.Second)
	vm.RequireResult(t, guest.ResultEchoServeReady, 60*time.Second)
	bin := qemu.DaemonBinary(t)
	try := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"ctl", "--control", ctlPath}, args...)...).CombinedOutput()
		return string(out), err
	}
	ctl := func(args ...string) string {
		t.Helper()
		out, err := try(args...)
		if err != nil {
			t.Fatalf("vunet ctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// TCP.
	out := ctl("add", "-t", fmt.Sprintf("127.0.0.1/%d:%d", tcpPort, guestPort))
	if !strings.Contains(out, fmt.Sprintf("%d", tcpPort)) || !strings.Contains(out, "tcp") {
		t.Fatalf("vunet ctl add printed:\n%s", out)
	}
	c, err := ns.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort))
	if err != nil {
		t.Fatalf("dial the forward added at run time: %v", err)
	}
	msg := []byte("through a forward added while the guest runs")
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("guest echoed %q, %v; want %q", got, err, msg)
	}

	// The status while the connection is open: the guest's address, its
	// lease, its TCP flow.
	var st control.Status
	if err := json.Unmarshal([]byte(ctl("--json", "status")), &st); err != nil {
		t.Fatal(err)
	}
	ip := lease.Fields["ip"]
	if st.Guest.IPv4 != ip || st.Guest.DHCPLeases < 1 || st.Flows["tcp"] < 1 || st.Forwards["tcp"] != 1 ||
		len(st.Queues.Pairs) == 0 || !st.Queues.Pairs[0].Running || !slices.Contains(st.Guest.Seen, ip) {
		t.Errorf("status while a forwarded connection is open (guest leased %s): %+v", ip, st)
	}
	if text := ctl("status"); !strings.Contains(text, ip) || !strings.Contains(text, "tcp 1") {
		t.Errorf("vunet ctl status does not show the guest's %s and its TCP flow:\n%s", ip, text)
	}
	c.Close()

	ctl("remove", "-t", fmt.Sprintf("127.0.0.1/%d", tcpPort))
	if c, err := ns.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort)); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial after the removal: %v, want connection refused", err)
	}

	// A privileged port, once the sandbox dropped root: refused, and why.
	if out, err := try("add", "-t", fmt.Sprintf("127.0.0.1/80:%d", guestPort)); err == nil ||
		!strings.Contains(out, "below net.ipv4.ip_unprivileged_port_start") {
		t.Errorf("adding port 80 after the privilege drop: %v\n%s", err, out)
	}

	// UDP.
	ctl("add", "-u", fmt.Sprintf("127.0.0.1/%d:%d", udpPort, guestPort))
	var u net.Conn
	if err := ns.Do(func() (err error) {
		u, err = net.Dial("udp4", fmt.Sprintf("127.0.0.1:%d", udpPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	echo := func(p string) error {
		_ = u.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := u.Write([]byte(p)); err != nil {
			return err
		}
		b := make([]byte, 1500)
		n, err := u.Read(b)
		if err != nil {
			return err
		}
		if string(b[:n]) != p {
			return fmt.Errorf("echo %q, sent %q", b[:n], p)
		}
		return nil
	}
	var uerr error
	for try := 0; try < 5; try++ { // UDP: a datagram may be lost on the way
		if uerr = echo("a datagram through a UDP forward added at run time"); uerr == nil {
			break
		}
	}
	if uerr != nil {
		t.Fatalf("UDP through the forward added at run time: %v", uerr)
	}
	if err := echo(guest.EchoServeQuit); err != nil {
		t.Fatalf("quit: %v", err)
	}
	r := vm.RequireResult(t, guest.CheckEchoServe, 30*time.Second)
	if r.Fields["tcp_conns"] != "1" || r.Fields["tcp_bytes"] != strconv.Itoa(len(msg)) {
		t.Errorf("guest served %s", r.Format())
	}
	ctl("remove", "-u", fmt.Sprintf("127.0.0.1/%d", udpPort))
	// Nothing is bound to the port any more: the peer's next datagram is
	// answered by a port unreachable, which its connected socket reports.
	_ = u.SetDeadline(time.Now().Add(3 * time.Second))
	_, _ = u.Write([]byte("after the removal"))
	if _, err := u.Read(make([]byte, 64)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("UDP after the removal: %v, want connection refused", err)
	}
	if out := ctl("list"); strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("forwards left:\n%s", out)
	}
	vm.Finish(t)
}
