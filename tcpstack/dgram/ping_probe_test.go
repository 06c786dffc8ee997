package dgram

import (
	"errors"
	"os"
	"runtime"
	"testing"

	"vunet/test/testenv"

	"golang.org/x/sys/unix"
)

// TestProbePingSockets runs the probe in a fresh network namespace (where
// ping_group_range starts at its "1 0" default) with ping refused, then
// allowed.
func TestProbePingSockets(t *testing.T) {
	testenv.NeedRoot(t, "a private network namespace")
	done := make(chan struct{})
	var refused4, refused6, allowed4, allowed6 error
	var setupErr error
	go func() {
		defer close(done)
		// The thread is left in the new namespace and dies with the
		// goroutine: nothing else runs on it.
		runtime.LockOSThread()
		if setupErr = unix.Unshare(unix.CLONE_NEWNET); setupErr != nil {
			return
		}
		// Net sysctls under /proc/sys follow the opening thread's
		// namespace: this changes the new namespace only.
		if setupErr = os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("1 0"), 0); setupErr != nil {
			return
		}
		refused4, refused6 = ProbePingSockets()
		if setupErr = os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0); setupErr != nil {
			return
		}
		allowed4, allowed6 = ProbePingSockets()
	}()
	<-done
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	if !errors.Is(refused4, ErrPingRefused) {
		t.Errorf("IPv4 with ping refused: %v, want ErrPingRefused", refused4)
	}
	if refused6 != nil && !errors.Is(refused6, ErrPingRefused) {
		t.Errorf("IPv6 with ping refused: %v", refused6)
	}
	if allowed4 != nil || allowed6 != nil {
		t.Errorf("with ping allowed: %v, %v", allowed4, allowed6)
	}
}
