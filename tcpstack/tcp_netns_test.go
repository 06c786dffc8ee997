package tcpstack

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestTCPSmallBuffersNetns runs the stall and upload scenarios in a private
// network namespace whose tcp_rmem/tcp_wmem are tiny, with no buffer pinned
// anywhere: the kernel's auto-tuning stays on, as in production, and the
// window-clamp workaround must neither lock the window nor shrink it
// (DESIGN invariants 4 and 5 on this kernel).
func TestTCPSmallBuffersNetns(t *testing.T) {
	if os.Getenv("TCPSTACK_NETNS_CHILD") == "" {
		if os.Getuid() != 0 {
			t.Skip("needs root for a network namespace")
		}
		cmd := exec.Command("unshare", "-n", os.Args[0], "-test.run=^TestTCPSmallBuffersNetns$", "-test.v")
		cmd.Env = append(os.Environ(), "TCPSTACK_NETNS_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		if !bytes.Contains(out, []byte("--- PASS: TestTCPSmallBuffersNetns")) {
			t.Fatalf("child did not pass:\n%s", out)
		}
		t.Logf("child:\n%s", out)
		return
	}
	if err := exec.Command("ip", "link", "set", "lo", "up").Run(); err != nil {
		t.Fatalf("lo up: %v", err)
	}
	for _, f := range []string{"tcp_rmem", "tcp_wmem"} {
		if err := os.WriteFile("/proc/sys/net/ipv4/"+f, []byte("4096 8192 32768"), 0); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	t.Run("host_to_guest", func(t *testing.T) { tcpRunStallTransfer(t, TCPConfig{MTU: 1500}, 0) })
	t.Run("guest_to_host", func(t *testing.T) { tcpRunUpload(t, 0) })
}
