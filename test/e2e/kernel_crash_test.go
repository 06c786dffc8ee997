package e2e

import "testing"

// TestKernelCrash: the crash reports QEMU's TCG made the destination
// guests of TestQEMUMigration print (consoles of 2026-12-03/04, shortened)
// are found, from their first line; a console with only boot noise and
// agent results, a crash of another kind, and any crash next to what a
// device fault makes the guest print are not taken for one.
func TestKernelCrash(t *testing.T) {
	const (
		hrtimerWarn = "[    6.005781] ------------[ cut here ]------------\r\n" +
			"[    6.009403] WARNING: CPU: 0 PID: 0 at kernel/time/hrtimer.c:1779 __hrtimer_run_queues+0x14f/0x250\r\n" +
			"[    6.011186] Modules linked in: virtio_net\r\n[    6.012215] CPU: 0 PID: 0 Comm: swapper/0\r\n"
		hrtimerNull = "[    6.124074] BUG: kernel NULL pointer dereference, address: 0000000000000000\r\n" +
			"[    6.127209] #PF: supervisor instruction fetch in kernel mode\r\n" +
			"[    6.127561] #PF: error_code(0x0010) - not-present page\r\n" +
			"[    6.135497]  __hrtimer_run_queues+0x10d/0x250\r\n" +
			"[    6.147978] Kernel panic - not syncing: Fatal exception in interrupt\r\n"
		listDel = "VUNET-RESULT name=link ok=1\n" +
			"[    5.718329] list_del corruption. prev->next should be ff4f786800647dd0, but was ff4f786800647ce8.\n" +
			"[    5.721870] ------------[ cut here ]------------\n" +
			"[    5.729221]  do_epoll_wait+0x4ed/0x7f0\n"
	)
	for _, c := range []struct{ name, console, want string }{
		{"hrtimer warning", hrtimerWarn,
			"[    6.009403] WARNING: CPU: 0 PID: 0 at kernel/time/hrtimer.c:1779 __hrtimer_run_queues+0x14f/0x250 | " +
				"[    6.011186] Modules linked in: virtio_net | [    6.012215] CPU: 0 PID: 0 Comm: swapper/0"},
		{"hrtimer NULL function", hrtimerNull,
			"[    6.124074] BUG: kernel NULL pointer dereference, address: 0000000000000000 | " +
				"[    6.127209] #PF: supervisor instruction fetch in kernel mode | " +
				"[    6.127561] #PF: error_code(0x0010) - not-present page"},
		{"list_del in epoll", listDel,
			"[    5.718329] list_del corruption. prev->next should be ff4f786800647dd0, but was ff4f786800647ce8. | " +
				"[    5.721870] ------------[ cut here ]------------ | [    5.729221]  do_epoll_wait+0x4ed/0x7f0"},
		{"list_add", "[    5.819486] list_add corruption. next->prev should be prev (ff2169a4474326b8), but was ff2169a44625a1a8.\r\n" +
			"[    5.824648] kernel BUG at lib/list_debug.c:27!\r\n",
			"[    5.819486] list_add corruption. next->prev should be prev (ff2169a4474326b8), but was ff2169a44625a1a8. | " +
				"[    5.824648] kernel BUG at lib/list_debug.c:27!"},
		{"stack protector", "[    5.142796] Kernel panic - not syncing: stack-protector: Kernel stack is corrupted in: __schedule+0x9e7/0xa00\r\n",
			"[    5.142796] Kernel panic - not syncing: stack-protector: Kernel stack is corrupted in: __schedule+0x9e7/0xa00"},
		{"panic of another kind", "[    6.147978] Kernel panic - not syncing: Fatal exception in interrupt\n", ""},
		{"list_del elsewhere", "[    5.718329] list_del corruption. prev->next should be 1, but was 2.\n[    5.729221]  skb_release_data+0x1/0x2\n", ""},
		{"transmit timeout", "[   12.000001] NETDEV WATCHDOG: eth0 (virtio_net): transmit queue 0 timed out\n" +
			"[   12.000002] WARNING: CPU: 0 PID: 0 at net/sched/sch_generic.c:525 dev_watchdog+0x1/0x2\n", ""},
		{"device fault beside a TCG crash", "[    5.000000] virtio_net virtio0: output.0:id 7 is not a head!\n" + hrtimerNull, ""},
		{"boot noise", "[    0.917586] acpi PNP0A03:00: fail to add MMCONFIG information\n" +
			"VUNET-RESULT name=dhcp ok=1 detail=\"BUG: none\"\n", ""},
		{"empty", "", ""},
	} {
		if got := kernelCrash(c.console); got != c.want {
			t.Errorf("%s: kernelCrash = %q, want %q", c.name, got, c.want)
		}
	}
}
