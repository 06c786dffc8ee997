package rig

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"vunet/test/testenv"
)

// needRig checks what every rig test needs: root, /dev/net/tun, iproute2
// with netns support, busybox udhcpc, the go tool (to build vunet).
func needRig(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("rig test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, errors.New("needs root (network namespaces, TAP)"), "run as root: sudo -E go test ./test/rig/")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		testenv.Unavailable(t, err, "a kernel with CONFIG_TUN and /dev/net/tun (mknod /dev/net/tun c 10 200)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Unavailable(t, err, "apt-get install -y iproute2")
	}
	if _, err := findUdhcpc(); err != nil {
		testenv.Unavailable(t, err, "apt-get install -y busybox")
	}
	if os.Getenv("VUNET_RIG_BIN") == "" {
		if _, err := exec.LookPath("go"); err != nil {
			testenv.Unavailable(t, err, "the Go toolchain on PATH, or VUNET_RIG_BIN=/path/to/vunet")
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}
