package ops

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// virshFunc runs one virsh command against a libvirt daemon.
type virshFunc func(ctx context.Context, args ...string) (string, error)

// fetchCmdline is the guest's kernel command line for the libvirt tests:
// link, DHCP lease, then an HTTP fetch of page through the namespace's
// gateway; the agent's results go to the second serial port.
func fetchCmdline(ns *qemu.NetNS, page *pageServer) string {
	return guest.KernelArgs + " " + guest.Cmdline(
		[]string{guest.CheckLink, guest.CheckDHCP, guest.CheckHTTP},
		map[string]string{
			guest.ParamHTTP:    fmt.Sprintf("http://%s:%d/blob", ns.Host.Gateway, page.Port),
			guest.ParamResults: "/dev/ttyS1",
			guest.ParamTimeout: "40s",
		})
}

// testDomain is one transient domain of a test and the files that tell
// what became of it.
type testDomain struct {
	Name, XML, Path  string            // the name, the XML and where it is written
	Console, Results string            // the serial files (bootableDomain)
	Logs             map[string]string // more files to show on failure, by title
}

// create writes the XML, checks it against libvirt's schema when
// virt-xml-validate is there, and creates the transient domain. t.Cleanup
// destroys it (an already gone one is fine) and, when t failed, logs the
// XML, the Logs, the console and the results.
func (d testDomain) create(t *testing.T, ctx context.Context, virsh virshFunc) {
	t.Helper()
	if err := os.WriteFile(d.Path, []byte(d.XML), 0o644); err != nil {
		t.Fatal(err)
	}
	if validate, err := exec.LookPath("virt-xml-validate"); err == nil {
		if out, err := exec.Command(validate, d.Path, "domain").CombinedOutput(); err != nil {
			t.Errorf("virt-xml-validate %s domain: %v\n%s", d.Path, err, out)
		}
	}
	started := time.Now()
	if _, err := virsh(ctx, "create", d.Path); err != nil {
		var logs strings.Builder
		for title, path := range d.Logs {
			fmt.Fprintf(&logs, "\n%s (%s):\n%s", title, path, tail(path, 20))
		}
		t.Fatalf("%v\ndomain XML:\n%s%s", err, d.XML, logs.String())
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer dcancel()
		if out, err := virsh(dctx, "destroy", d.Name); err == nil {
			t.Logf("virsh destroy %s: %s", d.Name, strings.TrimSpace(out))
		}
		if t.Failed() {
			t.Logf("domain XML (%s):\n%s", d.Path, d.XML)
			for title, path := range d.Logs {
				t.Logf("%s (%s):\n%s", title, path, tail(path, 30))
			}
			t.Logf("guest console (%s):\n%s", d.Console, tail(d.Console, 40))
			t.Logf("agent results (%s):\n%s", d.Results, tail(d.Results, 20))
		}
	})
	t.Logf("virsh create %s: domain %s started in %v", d.Path, d.Name, time.Since(started).Round(time.Millisecond))
}

// guestResults waits for the agent's last result, logs every result,
// fails t on a failed check, and returns them by name.
func (d testDomain) guestResults(t *testing.T, ctx context.Context) map[string]guest.Result {
	t.Helper()
	res, err := waitResults(ctx, d.Results, guest.ResultDone)
	for _, r := range res {
		t.Logf("guest: %s", r)
	}
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]guest.Result{}
	for _, r := range res {
		byName[r.Name] = r
		if !r.OK {
			t.Errorf("guest check %s failed: %s", r.Name, r)
		}
	}
	return byName
}
