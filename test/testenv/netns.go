package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// netnsChildEnv marks the child process InPrivateNetns starts.
const netnsChildEnv = "VUNET_TEST_NETNS_CHILD"

// InPrivateNetns runs the calling top-level test again in a child process
// in a new network namespace, where per-namespace sysctls (ping_group_range,
// tcp_rmem, …) can be set without touching the host. In the child it brings
// loopback up, writes sysctls (paths under /proc/sys/net/ipv4) and returns
// true: the caller goes on with the test body. In the parent it requires the
// child to report PASS (a skip in the child fails) and returns false. It
// needs root and unshare(1) (NeedRoot, NeedTool).
func InPrivateNetns(t *testing.T, sysctls map[string]string) bool {
	t.Helper()
	if os.Getenv(netnsChildEnv) != "" {
		if err := exec.Command("ip", "link", "set", "lo", "up").Run(); err != nil {
			t.Fatalf("lo up: %v", err)
		}
		for k, v := range sysctls {
			if err := os.WriteFile("/proc/sys/net/ipv4/"+k, []byte(v), 0); err != nil {
				t.Fatalf("sysctl %s: %v", k, err)
			}
		}
		return true
	}
	NeedRoot(t, "a private network namespace")
	unshare := NeedTool(t, "unshare", "", "apt-get install util-linux")
	NeedTool(t, "ip", "", "apt-get install iproute2")
	cmd := exec.Command(unshare, "-n", os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), netnsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("child did not pass:\n%s", out)
	}
	t.Logf("child:\n%s", out)
	return false
}

// PingAllowed is the sysctl (for InPrivateNetns) that lets any group open
// ping sockets.
var PingAllowed = map[string]string{"ping_group_range": "0 2147483647"}
