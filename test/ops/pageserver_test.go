package ops

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"vunet/test/qemu"
)

// pageServer serves one random blob over HTTP on 127.0.0.1 inside a test's
// namespace: the guest reaches it through the gateway address, which vunet
// maps to the loopback of the namespace it runs in.
type pageServer struct {
	Port   int
	Size   int
	SHA256 string
	served atomic.Int64 // complete responses
}

// startPageServer serves size random bytes at every path; t.Cleanup stops it.
func startPageServer(t *testing.T, ns *qemu.NetNS, size int) *pageServer {
	t.Helper()
	return startPacedPageServer(t, ns, size, 1, 0)
}

// startPacedPageServer is startPageServer writing each response in chunks
// pieces with pause between them, so a transfer lasts at least
// (chunks-1)*pause however fast the guest is: long enough for a scraper
// to see it in progress.
func startPacedPageServer(t *testing.T, ns *qemu.NetNS, size, chunks int, pause time.Duration) *pageServer {
	t.Helper()
	blob := make([]byte, size)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(blob)
	var ln net.Listener
	listen := func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}
	var err error
	if ns != nil {
		err = ns.Do(listen)
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatalf("page server: %v", err)
	}
	p := &pageServer{Port: ln.Addr().(*net.TCPAddr).Port, Size: size, SHA256: hex.EncodeToString(sum[:])}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		sent := 0
		for i := 0; i < chunks; i++ {
			if i > 0 {
				w.(http.Flusher).Flush()
				time.Sleep(pause)
			}
			n, err := w.Write(blob[i*size/chunks : (i+1)*size/chunks])
			sent += n
			if err != nil {
				return
			}
		}
		if sent == size {
			p.served.Add(1)
		}
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return p
}

// checkFetched asserts the guest's http result matches the blob and that the
// server saw the request through.
func (p *pageServer) checkFetched(t *testing.T, fields map[string]string) {
	t.Helper()
	if fields["status"] != "200" || fields["bytes"] != strconv.Itoa(p.Size) || fields["sha256"] != p.SHA256 {
		t.Errorf("guest fetched status %s, %s bytes, sha256 %s; server sent %d bytes, sha256 %s",
			fields["status"], fields["bytes"], fields["sha256"], p.Size, p.SHA256)
	}
	if n := p.served.Load(); n != 1 {
		t.Errorf("server completed %d responses, want 1", n)
	}
}
