package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"vunet/test/qemu"
	"vunet/test/testenv"
)

// TestDemo runs what `make demo` runs and checks what it reports, so CI
// proves the demo works on a fresh machine.
func TestDemo(t *testing.T) {
	qemu.NeedQEMU(t)
	out := &testWriter{t: t}
	rep, err := Run(context.Background(), Config{Out: out})
	var missing *MissingError
	if errors.As(err, &missing) {
		testenv.Unavailable(t, err, missing.Hint)
	}
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if rep.RunTook > 2*time.Minute || rep.RunTook == 0 {
		t.Errorf("demo ran %v after building, promised under 2 minutes", rep.RunTook)
	}
	t.Logf("demo: built in %v, ran in %v", rep.BuildTook.Round(time.Millisecond), rep.RunTook.Round(time.Millisecond))
	if rep.Lease["ip"] == "" || rep.Lease["router"] != rep.Gateway {
		t.Errorf("lease %v: want an address and router %s (the gateway vunet announced)", rep.Lease, rep.Gateway)
	}
	page := len(demoPage())
	if rep.HTTP["status"] != "200" || rep.HTTP["bytes"] != strconv.Itoa(page) || rep.HTTP["sha256"] != rep.PageSHA {
		t.Errorf("guest fetched %v, want status 200, %d bytes, sha256 %s", rep.HTTP, page, rep.PageSHA)
	}
	if len(rep.Served) != 1 || !strings.HasPrefix(rep.Served[0].Remote, "127.0.0.1:") {
		t.Errorf("server saw %v, want one request from 127.0.0.1", rep.Served)
	}
	m := rep.Metrics
	for _, c := range []struct {
		name   string
		labels []string
		min    float64
	}{
		{"vunet_queue_frames_total", []string{"direction", "from_guest"}, 10},
		// DHCP OFFER and ACK, an ARP reply, the SYN-ACK, the page in two
		// frames at least (65,599 bytes), our FIN: 7. How many ACKs go on
		// their own varies with timing (9 in one CI run, 10 or more in others).
		{"vunet_queue_frames_total", []string{"direction", "to_guest"}, 7},
		{"vunet_queue_bytes_total", []string{"direction", "to_guest"}, float64(page)},
		{"vunet_service_replies_total", []string{"service", "dhcp"}, 2},
		{"vunet_tcp_connects_total", nil, 1},
		{"vunet_tcp_payload_bytes_total", []string{"direction", "to_guest"}, float64(page)},
	} {
		if v := m.Sum(c.name, c.labels...); v < c.min {
			t.Errorf("%s%v = %v, want >= %v", c.name, c.labels, v, c.min)
		}
	}
	if rep.WorkDir != "" {
		t.Errorf("work directory %s left behind after a successful run", rep.WorkDir)
	}
}

// testWriter sends the demo's output to the test log line by line.
type testWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}
