package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/test/guest"
	"vunet/test/guest/initramfs"
	"vunet/test/qemu"
)

// TestQEMUWindowReopenGuestKernel runs hostsock's window experiment
// (TestWindowReopens: a loopback sender fills a socket's receive window,
// vunet's sequence peeks the data and consumes it as a guest ACK makes it
// do, and the sender's reopened window is measured with and without the
// TCP_WINDOW_CLAMP workaround) on the kernel the test guests boot —
// Debian 12's 6.1, where the host runs another — as a static test binary
// in the guest's initramfs, and next to it on the host's kernel. It needs
// no vunet: the workaround is a matter of the kernel under the daemon. The
// guest run must pass (the window the daemon leaves reopens, the
// workaround never leaves less) and say what it measured.
func TestQEMUWindowReopenGuestKernel(t *testing.T) {
	qemu.NeedQEMU(t)
	root, err := initramfs.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "hostsock.test")
	build := exec.CommandContext(ctx, "go", "test", "-c", "-trimpath", "-o", bin, "./tcpstack/hostsock")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c ./tcpstack/hostsock: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	const inImage = "/hostsock.test"
	img, err := initramfs.Build(ctx, initramfs.Options{Files: []initramfs.File{{Path: inImage, Mode: 0o755, Data: data}}})
	if err != nil {
		t.Fatalf("guest image with the test binary: %v", err)
	}
	vm := qemu.StartVM(t, qemu.VMConfig{
		NoNIC:  true,
		Image:  img,
		Checks: []string{guest.CheckGoTest},
		Params: map[string]string{
			guest.ParamGoTest:    inImage,
			guest.ParamGoTestRun: "^TestWindowReopens$",
			guest.ParamTimeout:   "2m",
		},
		MemoryMiB: 512,
		Timeout:   4 * time.Minute,
	})
	r := vm.RequireResult(t, guest.CheckGoTest, 3*time.Minute)
	vm.Finish(t)

	// The same trials on the host's kernel, for the record.
	host := map[hostsock.WindowMode]hostsock.WindowTrial{}
	for _, m := range []hostsock.WindowMode{hostsock.WindowAlone, hostsock.WindowClampAfter, hostsock.WindowClampAtZero} {
		w, err := hostsock.RunWindowTrial(m, time.Second)
		if err != nil {
			t.Fatalf("host trial %v: %v", m, err)
		}
		host[m] = w
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	t.Logf("sender window reopened after the guest's ACK (bytes; sent/delivered after it):")
	t.Logf("  host  %-22s alone %6d/%d  clamp after %6d/%d  clamp at zero %6d  (daemon applies it: %v)",
		unix.ByteSliceToString(uts.Release[:]), host[hostsock.WindowAlone].Reopened, host[hostsock.WindowAlone].Delivered,
		host[hostsock.WindowClampAfter].Reopened, host[hostsock.WindowClampAfter].Delivered,
		host[hostsock.WindowClampAtZero].Reopened, hostsock.ProbeWindowKernel().NeedsClamp())
	f := r.Fields
	t.Logf("  guest %-22s alone %6s/%s  clamp after %6s/%s  clamp at zero %6s  (daemon applies it: %s)",
		f["kernel"], f["alone"], f["alone_delivered"], f["clamp_after"], f["clamp_after_delivered"],
		f["clamp_at_zero"], f["needs_clamp"])
	if !r.OK {
		t.Fatalf("TestWindowReopens failed on the guest's kernel: %s", r.Format())
	}
	if !strings.HasPrefix(f["kernel"], img.KernelVersion) {
		t.Errorf("guest ran kernel %q, the image has %q", f["kernel"], img.KernelVersion)
	}
	alone, _ := strconv.Atoi(f["alone"])
	after, _ := strconv.Atoi(f["clamp_after"])
	if alone <= 0 && f["needs_clamp"] != "true" {
		t.Errorf("guest kernel: the window stays shut and the daemon would not help (%s)", r.Format())
	}
	if after < alone {
		t.Errorf("guest kernel: the workaround left the sender %d bytes, %d without it", after, alone)
	}
}
