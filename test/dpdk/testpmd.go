package dpdk

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/test/qemu"
	rig "vunet/test/rig/lib"
)

// TestpmdHint is the install hint for a missing dpdk-testpmd.
const TestpmdHint = rig.TestpmdHint

// Testpmd is a running dpdk-testpmd bridging virtio-user (port 0) and a TAP
// device (port 1), stopped by t.Cleanup.
type Testpmd struct {
	Tap    string        // name of the kernel TAP device
	Out    *qemu.LogSink // stdout and stderr lines
	OutLog string        // copy on disk
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// TestpmdPages is the number of free 2 MiB hugepages to have before
// starting testpmd: its 4096 mbufs, rings and EAL heap fit in well under
// 100 MiB.
const TestpmdPages = 96

// StartTestpmd runs testpmd against the vhost-user socket (vunet must
// already listen on it). With memMiB 0, EAL allocates memory as it goes:
// virtio-user then sends SET_MEM_TABLE again (between SET_VRING_ENABLE 0
// and 1) each time its memory grows after the rings are set up, the
// message order QEMU never produces. With memMiB > 0 (-m) the memory is
// reserved up front and the table is sent once.
func StartTestpmd(t testing.TB, bin, socket, tap string, memMiB int) *Testpmd {
	t.Helper()
	dir := qemu.WorkDir(t)
	tp := &Testpmd{Tap: tap, Out: qemu.NewLogSink(), OutLog: filepath.Join(dir, "testpmd.log"), exited: make(chan struct{})}
	// --in-memory keeps hugepage files and shared config out of the file
	// system, but EAL still makes an (empty) runtime directory named after
	// the prefix: a unique prefix lets cleanup remove exactly ours.
	prefix := fmt.Sprintf("vunet-e2e-%d", os.Getpid())
	_, err := os.Stat("/run/dpdk")
	hadRunDir := err == nil
	t.Cleanup(func() {
		_ = os.RemoveAll(filepath.Join("/run/dpdk", prefix))
		if !hadRunDir {
			_ = os.Remove("/run/dpdk") // only if empty: another DPDK user may have come
		}
	})
	args := []string{
		"-l", "0,1", "--no-pci", "--in-memory", "--single-file-segments", "--file-prefix", prefix,
		"--no-telemetry", "--log-level", "lib.eal:notice",
	}
	if memMiB > 0 {
		args = append(args, "-m", fmt.Sprint(memMiB))
	}
	args = append(args,
		"--vdev", "net_virtio_user0,path="+socket+",queue_size=1024",
		"--vdev", "net_tap0,iface="+tap,
		"--",
		"--forward-mode=io", "--auto-start", "--stats-period", "1",
		"--total-num-mbufs", "4096", "--nb-cores", "1",
	)
	f, err := os.Create(tp.OutLog)
	if err != nil {
		t.Fatalf("testpmd log: %v", err)
	}
	tp.cmd = exec.Command(bin, args...)
	pipe, err := tp.cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("testpmd stdout: %v", err)
	}
	tp.cmd.Stderr = tp.cmd.Stdout
	tp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := tp.cmd.Start(); err != nil {
		t.Fatalf("start testpmd: %v", err)
	}
	t.Logf("testpmd: %s %s (pid %d)", bin, strings.Join(args, " "), tp.cmd.Process.Pid)
	outDone := make(chan struct{})
	go func() {
		tp.Out.Consume(pipe, f)
		close(outDone)
	}()
	go func() {
		<-outDone
		tp.err = tp.cmd.Wait()
		f.Close()
		close(tp.exited)
	}()
	t.Cleanup(func() {
		_ = tp.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("testpmd output tail (%s):\n%s", tp.OutLog, tp.Out.Tail(40))
		}
	})
	return tp
}

// Stop sends SIGINT (testpmd then stops forwarding, prints its final
// statistics and closes the ports), waits up to grace, then kills it.
func (tp *Testpmd) Stop(grace time.Duration) error {
	select {
	case <-tp.exited:
		return tp.err
	default:
	}
	_ = tp.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-tp.exited:
		return tp.err
	case <-time.After(grace):
	}
	_ = syscall.Kill(-tp.cmd.Process.Pid, syscall.SIGKILL)
	<-tp.exited
	return fmt.Errorf("testpmd ignored SIGINT for %v and was killed", grace)
}

// Exited is closed when testpmd has exited.
func (tp *Testpmd) Exited() <-chan struct{} { return tp.exited }

// Output returns everything testpmd printed so far.
func (tp *Testpmd) Output() string {
	var b strings.Builder
	for _, l := range tp.Out.Lines() {
		b.WriteString(l.Raw)
		b.WriteByte('\n')
	}
	return b.String()
}
