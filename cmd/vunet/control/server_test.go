package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/tcpstack"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// startServer serves b on a fresh socket for the test's life.
func startServer(t *testing.T, b Backend, cfg Config) (*Client, string) {
	t.Helper()
	cfg.Path = filepath.Join(t.TempDir(), "control.sock")
	if cfg.QueuePairs == 0 {
		cfg.QueuePairs = 1
	}
	if cfg.UnprivilegedPortStart == 0 {
		cfg.UnprivilegedPortStart = 1024
	}
	cfg.Logger = testenv.Logger()
	s, err := Listen(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return NewClient(cfg.Path), cfg.Path
}

// newStack is a data plane with a configured guest and no queue pair
// running: forward changes run on the caller's goroutine.
func newStack(t *testing.T) *tcpstack.Stack {
	t.Helper()
	cfg := tcpstack.Config{Logger: testenv.Logger()}
	cfg.Addr.IPv4 = linksvc.IPv4Config{Addr: netip.MustParseAddr("10.0.2.15"), PrefixLen: 24, Gateway: netip.MustParseAddr("10.0.2.2")}
	cfg.Addr.GuestMAC = [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	s := tcpstack.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// freePort is a loopback port nothing listens on (now) for network.
func freePort(t *testing.T, network string) uint16 {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return uint16(c.LocalAddr().(*net.UDPAddr).Port)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func apiStatus(err error) int {
	var e *APIError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// TestBadRequests: specs and bodies the endpoint refuses get 400 and a
// message that says what is wrong; nothing is opened.
func TestBadRequests(t *testing.T) {
	st := newStack(t)
	c, path := startServer(t, st, Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		proto, spec, want string
	}{
		{"tcp", "all", "explicit ports"},
		{"tcp", "none", "explicit ports"},
		{"tcp", "auto", "explicit ports"},
		{"tcp", "~22", "explicit ports"},
		{"tcp", "127.0.0.1/all", "explicit ports"},
		{"tcp", "http", "not a port number"},
		{"tcp", "0", "out of range"},
		{"tcp", "70000", "out of range"},
		{"tcp", "8010-8000", "reversed"},
		{"tcp", "8000-8010:80-81", "differ in size"},
		{"tcp", "10000-12000", "at most 1024"},
		{"tcp", "example.org/80", "not an IP address"},
		{"tcp", "", "no ports"},
		{"icmp", "8080", `protocol "icmp": want tcp or udp`},
		{"", "8080", "want tcp or udp"},
	} {
		_, err := c.Add(ctx, tc.proto, tc.spec)
		if apiStatus(err) != http.StatusBadRequest || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("add %s %q: %v (status %d), want 400 with %q", tc.proto, tc.spec, err, apiStatus(err), tc.want)
		}
	}
	if _, err := c.Remove(ctx, "tcp", "8080:80"); apiStatus(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "host ports only") {
		t.Errorf("remove with a guest port: %v", err)
	}
	// Bodies that are not one ForwardRequest.
	raw := func(method, body string) (int, string) {
		hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return net.Dial("unix", path)
		}}}
		req, _ := http.NewRequest(method, "http://vunet/v1/forwards", strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	for _, body := range []string{`{"protocol":"tcp","spec":"8080","extra":1}`, `{"protocol":"tcp","spec":"8080"}{}`, `not json`, strings.Repeat(" ", maxBody+1)} {
		if code, msg := raw(http.MethodPost, body); code != http.StatusBadRequest || !strings.Contains(msg, `"error"`) {
			t.Errorf("body %.40q: %d %s", body, code, msg)
		}
	}
	if code, _ := raw(http.MethodPut, `{}`); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d, want 405", code)
	}
	if fws, err := c.Forwards(ctx); err != nil || len(fws) != 0 {
		t.Fatalf("after refused requests: %v %v", fws, err)
	}
}

// TestAddListRemove: a TCP and a UDP forward added through the endpoint
// are open (a connection and a datagram reach their sockets), listed with
// their IDs, refused when they would overlap (409, naming the forward in
// the way), and closed when removed by spec or by ID; a second removal
// finds nothing (404). The forward gauges follow.
func TestAddListRemove(t *testing.T) {
	st := newStack(t)
	c, _ := startServer(t, st, Config{Families: Families{Disable6: true}})
	ctx := context.Background()
	tp, up := freePort(t, "tcp"), freePort(t, "udp")

	added, err := c.Add(ctx, "tcp", fmt.Sprintf("127.0.0.1/%d:80", tp))
	if err != nil {
		t.Fatal(err)
	}
	if len(added) != 1 || added[0].Protocol != "tcp" || added[0].Address != "127.0.0.1" || added[0].HostPort != tp || added[0].GuestPort != 80 {
		t.Fatalf("added %+v", added)
	}
	conn, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", tp))
	if err != nil {
		t.Fatalf("the forwarded TCP port: %v", err)
	}
	conn.Close()
	// Without an address: every IPv4 address (IPv6 is off here).
	uadded, err := c.Add(ctx, "udp", fmt.Sprint(up))
	if err != nil {
		t.Fatal(err)
	}
	if len(uadded) != 1 || uadded[0].Address != "0.0.0.0" || uadded[0].GuestPort != up {
		t.Fatalf("udp added %+v", uadded)
	}
	if c2, err := net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", up)); err == nil {
		c2.Close()
		t.Fatal("the forwarded UDP port is not bound")
	}
	list, err := c.Forwards(ctx)
	if err != nil || len(list) != 2 || list[0].ID != added[0].ID || list[1].ID != uadded[0].ID {
		t.Fatalf("list %+v %v", list, err)
	}
	if n := st.ForwardStats().Ports[stats.FlowTCP].Load() + st.ForwardStats().Ports[stats.FlowUDP].Load(); n != 2 {
		t.Fatalf("forward ports gauge %d, want 2", n)
	}

	// Overlaps: the same TCP port on every IPv4 address, the same UDP
	// port again.
	for _, o := range []struct{ proto, spec string }{{"tcp", fmt.Sprint(tp)}, {"udp", fmt.Sprintf("127.0.0.1/%d", up)}} {
		_, err := c.Add(ctx, o.proto, o.spec)
		if apiStatus(err) != http.StatusConflict || !strings.Contains(err.Error(), "overlaps a forwarded port") {
			t.Errorf("overlapping %s %s: %v, want 409", o.proto, o.spec, err)
		}
	}
	// A port another process holds: 409 too.
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bp := busy.Addr().(*net.TCPAddr).Port
	if _, err := c.Add(ctx, "tcp", fmt.Sprintf("127.0.0.1/%d", bp)); apiStatus(err) != http.StatusConflict || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("a port in use: %v", err)
	}

	gone, err := c.Remove(ctx, "tcp", fmt.Sprintf("127.0.0.1/%d", tp))
	if err != nil || len(gone) != 1 || gone[0].ID != added[0].ID {
		t.Fatalf("remove tcp: %+v %v", gone, err)
	}
	if conn, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", tp)); !errors.Is(err, syscall.ECONNREFUSED) {
		if conn != nil {
			conn.Close()
		}
		t.Fatalf("dial after removal: %v, want connection refused", err)
	}
	if _, err := c.Remove(ctx, "tcp", fmt.Sprintf("127.0.0.1/%d", tp)); apiStatus(err) != http.StatusNotFound || !strings.Contains(err.Error(), "no such forwarded port") {
		t.Errorf("second removal: %v, want 404", err)
	}
	// A spec without an address does not name a forward bound to one.
	if _, err := c.Remove(ctx, "udp", fmt.Sprintf("127.0.0.1/%d", up)); apiStatus(err) != http.StatusNotFound {
		t.Errorf("removal by another address: %v, want 404", err)
	}
	if gone, err := c.RemoveID(ctx, uadded[0].ID); err != nil || len(gone) != 1 || gone[0].Protocol != "udp" {
		t.Fatalf("remove by ID: %+v %v", gone, err)
	}
	if c2, err := net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", up)); err != nil {
		t.Fatalf("the UDP port is still bound after its removal: %v", err)
	} else {
		c2.Close()
	}
	if _, err := c.RemoveID(ctx, uadded[0].ID); apiStatus(err) != http.StatusNotFound {
		t.Errorf("removed ID again: %v, want 404", err)
	}
	if n := st.ForwardStats().Ports[stats.FlowTCP].Load() + st.ForwardStats().Ports[stats.FlowUDP].Load(); n != 0 {
		t.Fatalf("forward ports gauge %d after the removals", n)
	}
}

// TestStatus: the status names the guest's offered address, the queues
// and the forwards by protocol.
func TestStatus(t *testing.T) {
	st := newStack(t)
	c, _ := startServer(t, st, Config{QueuePairs: 4, Families: Families{Disable6: true}})
	ctx := context.Background()
	if _, err := c.Add(ctx, "tcp", fmt.Sprintf("127.0.0.1/%d", freePort(t, "tcp"))); err != nil {
		t.Fatal(err)
	}
	s, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Guest.IPv4 != "10.0.2.15" || s.Guest.MAC != "52:54:00:12:34:56" || s.Queues.Offered != 4 ||
		s.Forwards["tcp"] != 1 || s.Forwards["udp"] != 0 || s.Flows["tcp"] != 0 {
		t.Fatalf("status %+v", s)
	}
	// Pair 0 exists (its tables hold the forwards) and has not run.
	if len(s.Queues.Pairs) != 1 || s.Queues.Pairs[0].Running || s.Queues.Pairs[0].Capacity["tcp"] == 0 {
		t.Fatalf("pairs %+v", s.Queues.Pairs)
	}
}

// fakeBackend fails additions with err.
type fakeBackend struct {
	tcpstack.Stack
	err error
}

func (f *fakeBackend) AddForwards(stats.FlowProto, []tcpstack.Forward) ([]tcpstack.ForwardInfo, error) {
	return nil, f.err
}
func (f *fakeBackend) RemoveForwards([]uint64) error    { return nil }
func (f *fakeBackend) Forwards() []tcpstack.ForwardInfo { return nil }
func (f *fakeBackend) Status() tcpstack.Status          { return tcpstack.Status{} }

// TestAddErrors: why a bind failed decides the status, and a port the
// dropped privileges refuse is explained.
func TestAddErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		want string
	}{
		{fmt.Errorf("open tcp forward 0.0.0.0:80: listen: %w", syscall.EACCES), http.StatusForbidden, "below net.ipv4.ip_unprivileged_port_start (1024) needs privileges vunet has given up"},
		{fmt.Errorf("x: %w", syscall.EPERM), http.StatusForbidden, "operation not permitted"},
		{fmt.Errorf("x: %w", syscall.EADDRNOTAVAIL), http.StatusBadRequest, "cannot assign"},
		{fmt.Errorf("x: %w", syscall.EMFILE), http.StatusServiceUnavailable, "too many open files"},
		{tcpstack.ErrStackClosed, http.StatusServiceUnavailable, "closed"},
		{errors.New("odd"), http.StatusInternalServerError, "odd"},
	} {
		c, _ := startServer(t, &fakeBackend{err: tc.err}, Config{})
		_, err := c.Add(context.Background(), "tcp", "80")
		if apiStatus(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v (status %d), want %d with %q", tc.err, err, apiStatus(err), tc.code, tc.want)
		}
	}
}

// TestSocketFile: the socket is created with mode 0600 at most (file
// permissions are the endpoint's authentication), a stale file is
// replaced, a live endpoint's is not taken over, and the file goes when
// the endpoint stops.
func TestSocketFile(t *testing.T) {
	st := newStack(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "control.sock")
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // the file stays, nobody listens
	s, err := Listen(Config{Path: path, Logger: testenv.Logger()}, st)
	if err != nil {
		t.Fatalf("over a stale socket file: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket file %v %v, want a socket with mode 0600", fi.Mode(), err)
	}
	if _, err := Listen(Config{Path: path, Logger: testenv.Logger()}, st); err == nil {
		t.Fatal("a second endpoint took over a live socket")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	if _, err := NewClient(path).Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left after the endpoint stopped: %v", err)
	}
}
