package tcp

import (
	"testing"

	"vunet/test/testenv"
)

// TestTCPSmallBuffersNetns runs the stall and upload scenarios in a private
// network namespace whose tcp_rmem/tcp_wmem are tiny, with no buffer pinned
// anywhere: the kernel's auto-tuning stays on, as in production, and the
// window-clamp workaround must neither lock the window nor shrink it
// (DESIGN invariants 4 and 5 on this kernel).
func TestTCPSmallBuffersNetns(t *testing.T) {
	if !testenv.InPrivateNetns(t, map[string]string{"tcp_rmem": "4096 8192 32768", "tcp_wmem": "4096 8192 32768"}) {
		return
	}
	t.Run("host_to_guest", func(t *testing.T) { tcpRunStallTransfer(t, Config{MTU: 1500}, 0, false) })
	t.Run("host_to_guest_clamp_forced", func(t *testing.T) { tcpRunStallTransfer(t, Config{MTU: 1500}, 0, true) })
	t.Run("guest_to_host", func(t *testing.T) { tcpRunUpload(t, 0) })
}
