package main

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// powerOff ends the VM. As PID 1 the agent must never return: the kernel
// would panic. Restart is the fallback because the harness runs QEMU with
// -no-reboot, which turns a reboot into an exit as well.
func powerOff() {
	linksDown()
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	for {
		time.Sleep(time.Hour)
	}
}

// linksDown takes every network interface but lo down before the
// poweroff, which stops the virtio-net driver's NAPI polling and its
// transmissions for good.
//
// The guest kernel (Debian's 6.1.192) hangs in its poweroff otherwise,
// whatever the back-end, about once in ten runs that have traffic at the
// end: device_shutdown breaks every virtqueue (virtio_dev_shutdown,
// backported to 6.1) and then resets the device, and a NAPI poll or a
// transmission that comes after the break spins forever in virtio_net's
// TX clean-up loop (virtnet_poll_cleantx, start_xmit: free_old_xmit_skbs
// until virtqueue_enable_cb_delayed returns true, which it never does on a
// broken queue while the device has completed more buffers than the
// driver took back). ksoftirqd/0 soft-locks and QEMU never exits; Linux
// fixed the loop in 0d0eff39ceb3 ("virtio_ring: fix infinite loop in
// virtnet_poll_cleantx when device is broken"), which this kernel lacks.
// A link that is down has its NAPI disabled and sends nothing, so the
// break finds nobody to spin; the device is still reset, so the back-end
// still takes the rings back at every poweroff (SET_STATUS 0,
// GET_VRING_BASE) and QEMU still waits for its answers.
func linksDown() {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		fmt.Fprintf(os.Stderr, "vunet-agent: list interfaces before the poweroff: %v\n", err)
		return
	}
	for _, e := range ents {
		if e.Name() == "lo" {
			continue
		}
		if err := setFlagUp(e.Name(), false); err != nil {
			fmt.Fprintf(os.Stderr, "vunet-agent: before the poweroff: %v\n", err)
		}
	}
}
