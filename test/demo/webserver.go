package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pagePath is the page the guest fetches.
const pagePath = "/hello.html"

// webServer is the host-side end of the demo: a web server on the host's
// loopback only, which a guest can reach solely because vunet maps the
// gateway address to the host's loopback.
type webServer struct {
	srv    *http.Server
	port   int
	page   []byte
	sha256 string

	mu     sync.Mutex
	served []servedRequest
}

// servedRequest is one request as the server saw it.
type servedRequest struct {
	Remote string // vunet's host socket, a loopback address
	Path   string
	Bytes  int
	Status int
}

// demoPage returns the page: readable text, large enough (about 64 KiB) that
// it takes many frames and the byte counters show it, small enough that a TCG
// guest fetches it in a blink.
func demoPage() []byte {
	var b strings.Builder
	b.WriteString("<!doctype html>\n<title>Hello from the host</title>\n")
	b.WriteString("<h1>Hello, guest!</h1>\n<p>This page lives on the host's loopback (127.0.0.1). ")
	b.WriteString("You reached it through vunet: your TCP connection to the gateway became a host socket.</p>\n<pre>\n")
	for i := 0; b.Len() < 64<<10; i++ {
		fmt.Fprintf(&b, "line %05d: vhost-user frames in, native host sockets out\n", i)
	}
	b.WriteString("</pre>\n")
	return []byte(b.String())
}

// startWebServer listens on 127.0.0.1 at a free port.
func startWebServer() (*webServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("web server listen: %w", err)
	}
	w := &webServer{page: demoPage(), port: ln.Addr().(*net.TCPAddr).Port}
	sum := sha256.Sum256(w.page)
	w.sha256 = hex.EncodeToString(sum[:])
	w.srv = &http.Server{Handler: http.HandlerFunc(w.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = w.srv.Serve(ln) }()
	return w, nil
}

func (w *webServer) serve(rw http.ResponseWriter, r *http.Request) {
	req := servedRequest{Remote: r.RemoteAddr, Path: r.URL.Path, Status: http.StatusNotFound}
	if r.URL.Path == pagePath {
		rw.Header().Set("Content-Type", "text/html; charset=utf-8")
		rw.Header().Set("Content-Length", strconv.Itoa(len(w.page)))
		n, _ := rw.Write(w.page)
		req.Status, req.Bytes = http.StatusOK, n
	} else {
		http.NotFound(rw, r)
	}
	w.mu.Lock()
	w.served = append(w.served, req)
	w.mu.Unlock()
}

// requests returns what the server has served so far.
func (w *webServer) requests() []servedRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]servedRequest(nil), w.served...)
}

func (w *webServer) close() { _ = w.srv.Close() }
