package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/guest/initramfs"
	"vunet/test/testenv"
)

// QEMUHint is the install hint for a missing QEMU.
const QEMUHint = "apt-get install qemu-system-x86"

// NICID is the -device id of the vhost-user NIC (for query-rx-filter).
const NICID = "net0"

// VMConfig describes one guest.
type VMConfig struct {
	// Socket is the vhost-user socket. QEMU dials it, unless Server is set,
	// in which case QEMU listens on it and the daemon must dial (--connect).
	Socket string
	Server bool
	// Checks are the agent's checks, in order; Params are extra vunet.*
	// kernel parameters (see package guest).
	Checks []string
	Params map[string]string
	// MemoryMiB is guest memory (default 256); Queues the queue pairs (default 1).
	MemoryMiB int
	Queues    int
	// CPUs is the guest's vCPU count (default 1). Linux enables one queue
	// pair per vCPU, so multi-queue tests need CPUs >= Queues.
	CPUs int
	// MAC of the NIC (default 52:54:00:12:34:56).
	MAC string
	// Timeout bounds the guest's whole life (default 2 minutes): QEMU is
	// killed after it. Time QEMU waited for a CPU does not count, up to
	// ten times Timeout (starvation.go).
	Timeout time.Duration
	// Dir holds the QMP socket, serial files and QEMU's stderr; default WorkDir(t).
	Dir string
	// NoNIC boots without the vhost-user NIC (Socket unused); attach one
	// later with VM.HotplugVhostUser.
	NoNIC bool
	// Reconnect sets the client chardev's reconnect interval in seconds, so
	// QEMU redials a back-end that went away (ignored with Server).
	Reconnect int
	// Image is the kernel and initramfs to boot; zero: GuestImage's (an
	// image with extra files comes from initramfs.Build).
	Image initramfs.Image
	// Netdev, when set, replaces the vhost-user -netdev (and its chardev)
	// with this one, whose id must be n0: e.g. a -netdev stream dialling
	// vunet's stream transport, as libvirt's passt backend gives QEMU.
	Netdev string
	// ExtraFiles are inherited by QEMU as descriptors 3, 4, … (for a
	// Netdev's addr.type=fd).
	ExtraFiles []*os.File
	// Incoming starts QEMU as a migration destination (-incoming URI, e.g.
	// "unix:/path"): it waits, paused, for the source's state instead of
	// booting (see VM.Migrate). Everything else must match the source's
	// configuration.
	Incoming string
}

// VM is a running QEMU, killed by t.Cleanup.
type VM struct {
	QMP     *QMP
	MAC     string
	Console string // file receiving the guest console (ttyS0)
	Results string // file receiving the agent's result lines (ttyS1)
	Stderr  string // file receiving QEMU's stderr

	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	qmpPath string
}

// DefaultMAC is the NIC's MAC address unless VMConfig.MAC is set.
const DefaultMAC = "52:54:00:12:34:56"

// QEMUArgs returns the command line for cfg (without the binary).
func QEMUArgs(cfg VMConfig, kernel, initrd, qmpPath, console, results string) []string {
	mem := cfg.MemoryMiB
	if mem == 0 {
		mem = 256
	}
	queues := cfg.Queues
	if queues == 0 {
		queues = 1
	}
	cpus := cfg.CPUs
	if cpus == 0 {
		cpus = 1
	}
	mac := cfg.MAC
	if mac == "" {
		mac = DefaultMAC
	}
	chardev := "socket,id=c0,path=" + cfg.Socket
	if cfg.Server {
		chardev += ",server=on,wait=off"
	} else if cfg.Reconnect > 0 {
		chardev += fmt.Sprintf(",reconnect=%d", cfg.Reconnect)
	}
	netdev := "vhost-user,id=n0,chardev=c0"
	device := "virtio-net-pci,netdev=n0,id=" + NICID + ",mac=" + mac + ",vectors=0,romfile="
	if queues > 1 {
		netdev += fmt.Sprintf(",queues=%d", queues)
		// Vectors would be 2*queues+2 with MSI-X; vectors=0 stays (TCG crash).
		device += ",mq=on"
	}
	params := map[string]string{guest.ParamResults: "/dev/ttyS1"}
	for k, v := range cfg.Params {
		params[k] = v
	}
	appendLine := guest.KernelArgs + " " + guest.Cmdline(cfg.Checks, params)
	nic := []string{"-chardev", chardev, "-netdev", netdev, "-device", device}
	if cfg.Netdev != "" {
		nic = []string{"-netdev", cfg.Netdev, "-device", device}
	}
	if cfg.NoNIC {
		nic = nil
	}
	args := []string{
		// KVM does not work on these machines and MSI-X with vhost-user
		// crashes QEMU 7.2 under TCG: tcg + vectors=0 (FIELD-NOTES.md).
		"-accel", "tcg", "-machine", "pc", "-cpu", "max", "-smp", fmt.Sprint(cpus),
		"-m", fmt.Sprint(mem),
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", mem),
		"-numa", "node,memdev=mem",
	}
	args = append(args, nic...)
	if cfg.Incoming != "" {
		args = append(args, "-incoming", cfg.Incoming)
	}
	return append(args,
		"-kernel", kernel, "-initrd", initrd, "-append", appendLine,
		"-display", "none", "-monitor", "none", "-nodefaults", "-no-user-config",
		"-serial", "file:"+console, "-serial", "file:"+results,
		"-qmp", "unix:"+qmpPath+",server=on,wait=off",
		"-no-reboot",
	)
}

// NeedQEMU checks QEMU and the guest image's inputs before a test starts
// anything else, so a host without them skips (or, under CI, fails) with
// the install hint instead of failing somewhere later.
func NeedQEMU(t testing.TB) {
	t.Helper()
	testenv.SkipIfShort(t)
	testenv.NeedTool(t, "qemu-system-x86_64", "VUNET_E2E_QEMU", QEMUHint)
	GuestImage(t)
}

// StartVM boots a guest with the agent and connects QMP (with
// VMConfig.Server, only once the test calls ConnectQMP).
func StartVM(t testing.TB, cfg VMConfig) *VM {
	t.Helper()
	bin := testenv.NeedTool(t, "qemu-system-x86_64", "VUNET_E2E_QEMU", QEMUHint)
	img := cfg.Image
	if img.Kernel == "" {
		img = GuestImage(t)
	}
	if cfg.Dir == "" {
		cfg.Dir = WorkDir(t)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	vm := &VM{
		MAC:     cfg.MAC,
		Console: filepath.Join(cfg.Dir, "console.log"),
		Results: filepath.Join(cfg.Dir, "results.log"),
		Stderr:  filepath.Join(cfg.Dir, "qemu.stderr"),
		exited:  make(chan struct{}),
	}
	if vm.MAC == "" {
		vm.MAC = DefaultMAC
	}
	qmpPath := filepath.Join(cfg.Dir, "qmp.sock")
	args := QEMUArgs(cfg, img.Kernel, img.Initrd, qmpPath, vm.Console, vm.Results)
	stderr, err := os.Create(vm.Stderr)
	if err != nil {
		t.Fatalf("qemu stderr: %v", err)
	}
	vm.cmd = exec.Command(bin, args...)
	vm.cmd.Stdout, vm.cmd.Stderr = stderr, stderr
	vm.cmd.ExtraFiles = cfg.ExtraFiles
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := vm.cmd.Start(); err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	t.Logf("qemu: %s %s (pid %d)", bin, strings.Join(args, " "), vm.cmd.Process.Pid)
	go func() {
		vm.exitErr = vm.cmd.Wait()
		stderr.Close()
		close(vm.exited)
	}()
	// The whole-life timeout: a hung guest must not hang the test binary.
	// Time QEMU spent waiting for a CPU does not count (starvation.go).
	stopLife := make(chan struct{})
	go func() {
		life := newLoadDeadline(vm.cmd.Process.Pid, cfg.Timeout)
		for {
			select {
			case <-vm.exited:
				return
			case <-stopLife:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if life.expired() {
				_ = syscall.Kill(-vm.cmd.Process.Pid, syscall.SIGKILL)
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stopLife)
		if vm.QMP != nil {
			vm.QMP.Close()
		}
		select {
		case <-vm.exited:
		default:
			_ = syscall.Kill(-vm.cmd.Process.Pid, syscall.SIGKILL)
			<-vm.exited
		}
		if t.Failed() {
			vm.dumpForFailure(t)
		}
		t.Logf("qemu ran %v, exit: %v", time.Since(start).Round(time.Millisecond), vm.exitErr)
	})

	vm.qmpPath = qmpPath
	if cfg.Server {
		// QEMU does not serve QMP until a back-end has connected to a
		// listening vhost-user chardev: wait for the socket only, the test
		// starts the daemon and then calls ConnectQMP.
		if err := waitSocket(cfg.Socket, vm.exited, 20*time.Second); err != nil {
			t.Fatalf("QEMU vhost-user socket: %v\nqemu stderr:\n%s", err, tailFile(vm.Stderr, 20))
		}
		return vm
	}
	vm.ConnectQMP(t)
	return vm
}

// ConnectQMP connects vm.QMP (StartVM does it itself unless VMConfig.Server).
func (vm *VM) ConnectQMP(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := dialQMPWhileRunning(ctx, vm.qmpPath, vm.exited)
	if err != nil {
		t.Fatalf("QMP: %v\nqemu stderr:\n%s", err, tailFile(vm.Stderr, 20))
	}
	vm.QMP = q
}

func dialQMPWhileRunning(ctx context.Context, path string, exited <-chan struct{}) (*QMP, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	q, err := DialQMP(ctx, path)
	if err != nil {
		select {
		case <-exited:
			return nil, fmt.Errorf("QEMU exited during start-up: %w", err)
		default:
		}
	}
	return q, err
}

// HotplugVhostUser attaches a vhost-user virtio-net NIC at run time through
// QMP (chardev-add, netdev_add, device_add, as QEMU 7.2 accepts them) as
// device id, with chardev id+"-c" and netdev id+"-n". The chardev dials
// socket and redials every second if the back-end goes away.
func (vm *VM) HotplugVhostUser(ctx context.Context, socket, id, mac string) error {
	chardev := map[string]any{
		"id": id + "-c",
		"backend": map[string]any{"type": "socket", "data": map[string]any{
			"addr":      map[string]any{"type": "unix", "data": map[string]any{"path": socket}},
			"server":    false,
			"reconnect": 1,
		}},
	}
	if _, err := vm.QMP.Run(ctx, "chardev-add", chardev); err != nil {
		return err
	}
	if _, err := vm.QMP.Run(ctx, "netdev_add", map[string]any{"type": "vhost-user", "id": id + "-n", "chardev": id + "-c"}); err != nil {
		return err
	}
	_, err := vm.QMP.Run(ctx, "device_add", map[string]any{
		"driver": "virtio-net-pci", "id": id, "netdev": id + "-n", "mac": mac,
		"vectors": 0, "romfile": "",
	})
	return err
}

// UnplugVhostUser removes a NIC HotplugVhostUser attached: device_del,
// then, once the guest has released the device (DEVICE_DELETED), its
// netdev and chardev, which closes the vhost-user connection.
func (vm *VM) UnplugVhostUser(ctx context.Context, id string) error {
	if _, err := vm.QMP.Run(ctx, "device_del", map[string]any{"id": id}); err != nil {
		return err
	}
	if _, err := vm.QMP.WaitEvent(ctx, "DEVICE_DELETED", func(e QMPEvent) bool { return e.Data["device"] == id }); err != nil {
		return fmt.Errorf("guest did not release %s: %w", id, err)
	}
	if _, err := vm.QMP.Run(ctx, "netdev_del", map[string]any{"id": id + "-n"}); err != nil {
		return err
	}
	// QEMU 7.2's vhost-user netdev deletes its chardev with itself; other
	// versions may leave it.
	var chardevs []struct {
		Label string `json:"label"`
	}
	if err := vm.QMP.RunInto(ctx, "query-chardev", nil, &chardevs); err != nil {
		return err
	}
	for _, c := range chardevs {
		if c.Label == id+"-c" {
			_, err := vm.QMP.Run(ctx, "chardev-remove", map[string]any{"id": id + "-c"})
			return err
		}
	}
	return nil
}

// Kill kills QEMU at once, as a crash or an OOM kill would end it, and
// waits for it to exit.
func (vm *VM) Kill() {
	_ = syscall.Kill(-vm.cmd.Process.Pid, syscall.SIGKILL)
	<-vm.exited
}

// Exited is closed when QEMU has exited.
func (vm *VM) Exited() <-chan struct{} { return vm.exited }

// Pid is QEMU's process id.
func (vm *VM) Pid() int { return vm.cmd.Process.Pid }

// WaitExit waits up to timeout for QEMU to exit by itself (the agent powers
// the guest off after its last check) and returns its exit status.
func (vm *VM) WaitExit(timeout time.Duration) error {
	select {
	case <-vm.exited:
		return vm.exitErr
	case <-time.After(timeout):
		return fmt.Errorf("QEMU still running after %v", timeout)
	}
}

// ParsedResults returns every result line the agent has written so far;
// damaged lines are returned as errors.
func (vm *VM) ParsedResults() ([]guest.Result, []error) {
	b, _ := os.ReadFile(vm.Results)
	return parseResults(b)
}

// parseResults parses the complete lines of a results file. The agent ends
// each result with a newline, and the emulated UART reaches the file a few
// characters at a time: a last line without one is still being written, and
// parsed early it was a valid but cut result (the bench read an RR result
// as "name=rr ok=1 ms=", its latencies not yet written).
func parseResults(b []byte) ([]guest.Result, []error) {
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	var rs []guest.Result
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		r, err := guest.ParseResult(sc.Text())
		switch {
		case errors.Is(err, guest.ErrNoResult):
		case err != nil:
			errs = append(errs, err)
		default:
			rs = append(rs, r)
		}
	}
	return rs, errs
}

// WaitResult waits for the agent's result named name. It gives up early
// when QEMU exits without printing it.
//
// The timeout does not count the time QEMU waited for a CPU (a loaded
// machine), up to starvedCap times timeout (starvation.go).
func (vm *VM) WaitResult(name string, timeout time.Duration) (guest.Result, error) {
	deadline := newLoadDeadline(vm.cmd.Process.Pid, timeout)
	for {
		rs, _ := vm.ParsedResults()
		for _, r := range rs {
			if r.Name == name {
				return r, nil
			}
		}
		select {
		case <-vm.exited:
			rs, _ = vm.ParsedResults()
			for _, r := range rs {
				if r.Name == name {
					return r, nil
				}
			}
			return guest.Result{}, fmt.Errorf("QEMU exited (%v) without result %q", vm.exitErr, name)
		case <-time.After(100 * time.Millisecond):
		}
		if deadline.expired() {
			return guest.Result{}, fmt.Errorf("no result %q after %v", name, deadline)
		}
	}
}

// RequireResult waits for result name and fails t unless it is ok.
func (vm *VM) RequireResult(t testing.TB, name string, timeout time.Duration) guest.Result {
	t.Helper()
	r, err := vm.WaitResult(name, timeout)
	if err != nil {
		t.Fatalf("%v\nconsole tail:\n%s", err, tailFile(vm.Console, 30))
	}
	t.Logf("guest: %s", r.Format())
	if !r.OK {
		t.Fatalf("guest check %s failed: %s", name, r.Format())
	}
	return r
}

// Finish waits for the agent's "done" result, which must be ok (every
// check passed), and for QEMU to exit after the guest powers off.
func (vm *VM) Finish(t testing.TB) guest.Result {
	t.Helper()
	done := vm.RequireResult(t, guest.ResultDone, 30*time.Second)
	if err := vm.waitPowerOff(t); err != nil {
		t.Errorf("QEMU after the guest powered off: %v", err)
	}
	return done
}

// How long waitPowerOff gives QEMU: stuck (every thread asleep, no CPU time
// used) for exitQuiet is a hang, whatever the load; busy, it may take up
// to exitLimit on a loaded machine.
const (
	exitQuiet = 5 * time.Second
	exitLimit = 90 * time.Second
)

// waitPowerOff waits for QEMU to exit after the guest powered off, and
// tells a QEMU that waits for something (a vhost-user reply, say: its
// threads' kernel stacks are in the error) from one that is only slow.
func (vm *VM) waitPowerOff(t testing.TB) error {
	start := time.Now()
	stuck, ts := stuckFor(vm.cmd.Process.Pid, vm.exited, exitQuiet, exitLimit)
	// Not stuck: exited (Wait is about to return: the process is gone
	// from /proc or a zombie) or busy until the limit.
	wait := max(exitLimit-time.Since(start), 5*time.Second)
	if stuck {
		wait = 0
	}
	select {
	case <-vm.exited:
		if took := time.Since(start); took > 20*time.Second {
			t.Logf("QEMU took %v to exit after the guest powered off (busy, not stuck: a loaded machine)", took.Round(time.Millisecond))
		}
		return vm.exitErr
	case <-time.After(wait):
	}
	if stuck {
		return fmt.Errorf("QEMU stuck %v after the poweroff: every thread asleep and no CPU time used for %v; threads:\n%s",
			time.Since(start).Round(time.Millisecond), exitQuiet, formatThreads(ts))
	}
	return fmt.Errorf("QEMU still running %v after the poweroff, busy (not stuck); threads:\n%s", exitLimit, formatThreads(ts))
}

func (vm *VM) dumpForFailure(t testing.TB) {
	t.Logf("qemu stderr (%s):\n%s", vm.Stderr, tailFile(vm.Stderr, 20))
	// The agent's results are on the console too; show them once, below.
	var console []string
	for _, l := range strings.Split(tailFile(vm.Console, 200), "\n") {
		if !strings.Contains(l, guest.ResultPrefix) && strings.TrimSpace(l) != "" {
			console = append(console, l)
		}
	}
	if len(console) > 40 {
		console = console[len(console)-40:]
	}
	t.Logf("guest console without result lines (%s):\n%s", vm.Console, strings.Join(console, "\n"))
	t.Logf("agent results (%s):\n%s", vm.Results, tailFile(vm.Results, 20))
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
