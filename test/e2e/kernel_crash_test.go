package e2e

import "testing"

// TestKernelCrash: the crash reports TestQEMUMigration's destination
// guests printed (consoles of 2026-12-03/04, shortened) are found, from
// their first line; a console with only boot noise and agent results is
// not a crash.
func TestKernelCrash(t *testing.T) {
	for _, c := range []struct{ name, console, want string }{
		{"hrtimer warning", "[    6.005781] ------------[ cut here ]------------\r\n" +
			"[    6.009403] WARNING: CPU: 0 PID: 0 at kernel/time/hrtimer.c:1779 __hrtimer_run_queues+0x14f/0x250\r\n" +
			"[    6.011186] Modules linked in: virtio_net\r\n[    6.012215] CPU: 0 PID: 0 Comm: swapper/0\r\n",
			"[    6.009403] WARNING: CPU: 0 PID: 0 at kernel/time/hrtimer.c:1779 __hrtimer_run_queues+0x14f/0x250 | " +
				"[    6.011186] Modules linked in: virtio_net | [    6.012215] CPU: 0 PID: 0 Comm: swapper/0"},
		{"NULL call", "[    6.124074] BUG: kernel NULL pointer dereference, address: 0000000000000000\r\n" +
			"[    6.127209] #PF: supervisor instruction fetch in kernel mode\r\n",
			"[    6.124074] BUG: kernel NULL pointer dereference, address: 0000000000000000 | " +
				"[    6.127209] #PF: supervisor instruction fetch in kernel mode"},
		{"list corruption", "VUNET-RESULT name=link ok=1\n[    5.720001] list_del corruption. prev->next should be ff11, but was ff22\n",
			"[    5.720001] list_del corruption. prev->next should be ff11, but was ff22"},
		{"panic only", "[    6.147978] Kernel panic - not syncing: Fatal exception in interrupt\n",
			"[    6.147978] Kernel panic - not syncing: Fatal exception in interrupt"},
		{"boot noise", "[    0.917586] acpi PNP0A03:00: fail to add MMCONFIG information\n" +
			"VUNET-RESULT name=dhcp ok=1 detail=\"BUG: none\"\n", ""},
		{"empty", "", ""},
	} {
		if got := kernelCrash(c.console); got != c.want {
			t.Errorf("%s: kernelCrash = %q, want %q", c.name, got, c.want)
		}
	}
}
