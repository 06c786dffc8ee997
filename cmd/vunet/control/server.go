package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"vunet/tcpstack"
	"vunet/tcpstack/stats"
	"vunet/vhostuser"
)

// Backend is what the endpoint drives: tcpstack.Stack.
type Backend interface {
	AddForwards(proto stats.FlowProto, fws []tcpstack.Forward) ([]tcpstack.ForwardInfo, error)
	RemoveForwards(ids []uint64) error
	Forwards() []tcpstack.ForwardInfo
	Status() tcpstack.Status
}

// Config configures the endpoint.
type Config struct {
	// Path is the UNIX socket's path; Mode its permissions (default 0600:
	// the daemon's user only).
	Path string
	Mode os.FileMode
	// Families are the guest's address families (forwards without a bind
	// address listen on each).
	Families Families
	// QueuePairs is the number of queue pairs offered, for the status.
	QueuePairs int
	// UnprivilegedPortStart is net.ipv4.ip_unprivileged_port_start, read
	// at start-up (the sandbox opens no file later), to explain a bind
	// the dropped privileges refuse.
	UnprivilegedPortStart int
	// Logger gets a line per change (who asked, what changed).
	Logger *slog.Logger
}

// Server is the endpoint: a listening socket and its HTTP server.
type Server struct {
	cfg    Config
	b      Backend
	ln     *net.UnixListener
	remove func()
	leave  atomic.Bool // LeaveFile: the file is someone else's to remove
	srv    *http.Server
}

// maxBody bounds a request's body: a spec is at most a few hundred bytes.
const maxBody = 16 << 10

type peerKey struct{}

// Listen creates the socket (before the daemon drops privileges or
// sandboxes itself: the path may be one only start-up can write).
func Listen(cfg Config, b Backend) (*Server, error) {
	if cfg.Mode == 0 {
		cfg.Mode = 0o600
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, remove, err := vhostuser.ListenUnix(cfg.Path, cfg.Mode)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", cfg.Path, err)
	}
	s := &Server{cfg: cfg, b: b, ln: ln, remove: remove}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/forwards", s.list)
	mux.HandleFunc("POST /v1/forwards", s.add)
	mux.HandleFunc("DELETE /v1/forwards", s.removeSpec)
	mux.HandleFunc("DELETE /v1/forwards/{id}", s.removeID)
	mux.HandleFunc("GET /v1/status", s.status)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/v1/forwards" || p == "/v1/status" || strings.HasPrefix(p, "/v1/forwards/") {
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s %s: not in API v1", r.Method, p))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Errorf("no %s %s in API v1 (see vunet(1), CONTROL)", r.Method, p))
	})
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if uc, ok := c.(*net.UnixConn); ok {
				pid, uid, _ := vhostuser.PeerCred(uc)
				return context.WithValue(ctx, peerKey{}, [2]int{pid, uid})
			}
			return ctx
		},
	}
	return s, nil
}

// Serve answers requests until ctx ends, then closes the socket and
// removes its file.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.srv.Shutdown(sctx)
	})
	defer stop()
	s.cfg.Logger.Info("control endpoint listening", "socket", s.cfg.Path, "mode", fmt.Sprintf("%#o", uint32(s.cfg.Mode.Perm())))
	err := s.srv.Serve(s.ln)
	s.removeFile()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("control endpoint: %w", err)
}

// LeaveFile makes the endpoint leave its socket file for someone else to
// remove (the sandbox's keeper: the confined daemon may unlink nothing).
func (s *Server) LeaveFile() { s.leave.Store(true) }

// removeFile removes the socket file unless LeaveFile was called.
func (s *Server) removeFile() {
	if !s.leave.Load() {
		s.remove()
	}
}

// Close stops the endpoint at once and removes its file.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.ln.Close()
	s.removeFile()
	return err
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, forwardsOf(s.b.Forwards()))
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, statusOf(s.b.Status(), s.b.Forwards(), s.cfg.QueuePairs))
}

func (s *Server) add(w http.ResponseWriter, r *http.Request) {
	proto, req, err := readRequest(w, r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	fws, err := parseSpec(req.Spec)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	added, err := s.b.AddForwards(proto, StackForwards(fws, s.cfg.Families, false))
	if err != nil {
		code, err := s.addError(err)
		writeError(w, code, err)
		return
	}
	s.logChange(r, "forwards added", req, added)
	writeJSON(w, http.StatusCreated, forwardsOf(added))
}

func (s *Server) removeSpec(w http.ResponseWriter, r *http.Request) {
	_, req, err := readRequest(w, r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	fws, err := parseRemoveSpec(req.Spec)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	gone, err := matchForwards(s.b.Forwards(), req.Protocol, fws)
	if err != nil {
		writeError(w, http.StatusNotFound, err)
		return
	}
	s.removeForwards(w, r, req, gone)
}

func (s *Server) removeID(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("forward ID %q: not a number", r.PathValue("id")))
		return
	}
	for _, f := range s.b.Forwards() {
		if f.ID == id {
			s.removeForwards(w, r, ForwardRequest{Protocol: f.Proto.String(), Spec: "id " + strconv.FormatUint(id, 10)}, []tcpstack.ForwardInfo{f})
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Errorf("forward %d: %w", id, tcpstack.ErrNoForward))
}

func (s *Server) removeForwards(w http.ResponseWriter, r *http.Request, req ForwardRequest, gone []tcpstack.ForwardInfo) {
	ids := make([]uint64, len(gone))
	for i, f := range gone {
		ids[i] = f.ID
	}
	if err := s.b.RemoveForwards(ids); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, tcpstack.ErrNoForward) {
			code = http.StatusNotFound // removed meanwhile by another request
		}
		writeError(w, code, err)
		return
	}
	s.logChange(r, "forwards removed", req, gone)
	writeJSON(w, http.StatusOK, forwardsOf(gone))
}

// readRequest decodes a ForwardRequest and checks its protocol.
func readRequest(w http.ResponseWriter, r *http.Request) (stats.FlowProto, ForwardRequest, error) {
	var req ForwardRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return 0, req, fmt.Errorf("request body: want {\"protocol\": \"tcp\"|\"udp\", \"spec\": \"…\"}: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return 0, req, errors.New("request body: one JSON object only")
	}
	switch req.Protocol {
	case "tcp":
		return stats.FlowTCP, req, nil
	case "udp":
		return stats.FlowUDP, req, nil
	}
	return 0, req, fmt.Errorf("protocol %q: want tcp or udp", req.Protocol)
}

// addError says what a failed addition means to the client: the status
// and, for a bind the dropped privileges refuse, why.
func (s *Server) addError(err error) (int, error) {
	switch {
	case errors.Is(err, tcpstack.ErrForwardOverlap), errors.Is(err, syscall.EADDRINUSE):
		return http.StatusConflict, err
	case errors.Is(err, syscall.EACCES):
		start := s.cfg.UnprivilegedPortStart
		return http.StatusForbidden, fmt.Errorf("%w: binding a port below net.ipv4.ip_unprivileged_port_start (%d) needs privileges vunet has given up (--runas, the sandbox): forward a port from %d up, or give this one on the command line",
			err, start, start)
	case errors.Is(err, syscall.EPERM):
		return http.StatusForbidden, err
	case errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.ENODEV):
		return http.StatusBadRequest, err
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE), errors.Is(err, tcpstack.ErrStackClosed):
		return http.StatusServiceUnavailable, err
	}
	return http.StatusInternalServerError, err
}

// logChange logs a change with who asked for it (the peer's credentials).
func (s *Server) logChange(r *http.Request, msg string, req ForwardRequest, fws []tcpstack.ForwardInfo) {
	pid, uid := -1, -1
	if c, ok := r.Context().Value(peerKey{}).([2]int); ok {
		pid, uid = c[0], c[1]
	}
	ids := make([]uint64, len(fws))
	for i, f := range fws {
		ids[i] = f.ID
	}
	s.cfg.Logger.Info(msg, "protocol", req.Protocol, "spec", req.Spec, "ids", ids, "peer_pid", pid, "peer_uid", uid)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, Error{Error: err.Error()})
}
