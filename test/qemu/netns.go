package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"vunet/test/testenv"

	"golang.org/x/sys/unix"
)

// NetNS is a private network namespace for one test's daemon and host-side
// servers. It makes the traffic tests hermetic: the daemon finds a known
// "host" configuration there (NetNSHost, on a veth pair, since these
// kernels have no dummy driver), ping sockets can be allowed without
// touching the host's net.ipv4.ping_group_range (it is per namespace), and
// forwarded ports cannot collide with the host's.
type NetNS struct {
	Name string
	Path string // /run/netns/<Name>, for setns
	Host HostNet
	DNS4 netip.Addr
}

// NetNSHost is the default-route configuration inside every NetNS; the
// daemon detects it as "the host's" and hands it to the guest.
var NetNSHost = HostNet{
	Iface:   "v0",
	Addr:    []byte{10, 7, 0, 15},
	Prefix:  24,
	Gateway: []byte{10, 7, 0, 1},
	MTU:     1500,
	Addr6:   netip.MustParseAddr("fd07::15").AsSlice(),
	Prefix6: 64,
}

// NetNSGateway6 is NetNS's IPv6 default router (the daemon's global router
// address), and NetNSDNS4 the resolver in its resolv.conf.
var (
	NetNSGateway6 = netip.MustParseAddr("fd07::1")
	NetNSDNS4     = netip.MustParseAddr("10.7.0.53")
)

// NewNetNS creates a namespace with loopback up, ping sockets allowed for
// every group, and NetNSHost on interface v0. It needs root and ip(8);
// t.Cleanup deletes it.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	testenv.NeedRoot(t, "network namespaces")
	ip := testenv.NeedTool(t, "ip", "", "apt-get install iproute2")
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	n := &NetNS{Name: "vunet-e2e-" + hex.EncodeToString(rnd[:]), Host: NetNSHost, DNS4: NetNSDNS4}
	n.Path = "/run/netns/" + n.Name
	if out, err := exec.Command(ip, "netns", "add", n.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", n.Name, err, out)
	}
	etc := filepath.Join("/etc/netns", n.Name)
	t.Cleanup(func() {
		if out, err := exec.Command(ip, "netns", "del", n.Name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", n.Name, err, out)
		}
		os.RemoveAll(etc)
	})
	h := n.Host
	script := strings.Join([]string{
		"set -e",
		"ip link set lo up",
		"ip link add v0 type veth peer name v1",
		"ip link set v1 up",
		"ip link set v0 up",
		fmt.Sprintf("ip addr add %s/%d dev v0", h.Addr, h.Prefix),
		fmt.Sprintf("ip route add default via %s", h.Gateway),
		fmt.Sprintf("ip -6 addr add %s/%d dev v0 nodad", h.Addr6, h.Prefix6),
		fmt.Sprintf("ip -6 route add default via %s", NetNSGateway6),
		// Per namespace: the host's own setting is left alone.
		"echo '0 2147483647' > /proc/sys/net/ipv4/ping_group_range",
	}, "\n")
	if out, err := exec.Command(ip, "netns", "exec", n.Name, "sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("set up netns %s: %v: %s", n.Name, err, out)
	}
	// ip netns exec bind-mounts /etc/netns/<name>/* over /etc for the
	// daemon, which reads its resolvers from /etc/resolv.conf.
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver "+n.DNS4.String()+"\nsearch e2e.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// Command wraps argv so that it runs inside the namespace (ip netns exec
// execs it in place: the process keeps the pid exec.Cmd started).
func (n *NetNS) Command(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", n.Name}, argv...)
}

// Do runs fn on an OS thread switched into the namespace: sockets fn
// creates belong to it and keep working from any goroutine afterwards.
//
// The thread is switched back before it is unlocked. Letting it die
// instead (the usual shortcut) kills processes: any thread may be the one
// that forked a daemon or QEMU, whose Pdeathsig fires when that thread
// exits. Only when the switch back fails does the thread stay locked and
// die with the goroutine.
func (n *NetNS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open %s: %w", n.Path, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", n.Path, err)
			return
		}
		ferr := fn()
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else: stays locked, dies with this goroutine
		errc <- ferr
	}()
	return <-errc
}

// DialContext dials from inside the namespace (an http.Transport's
// DialContext, for instance).
func (n *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
