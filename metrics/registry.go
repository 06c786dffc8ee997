package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// NewRegistry returns a registry with vunet's collector over src (build
// information included) and the Go and process collectors.
func NewRegistry(src Sources) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		NewCollector(src),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// hiddenPrefixes are families of the stock collectors that do not describe
// vunet: process_network_* reads /proc/PID/net/dev, which counts the whole
// network namespace (every process's traffic and none of the guest's
// frames in particular), not this process.
var hiddenPrefixes = []string{"process_network_"}

// withoutHidden gathers from g and leaves out the hidden families.
func withoutHidden(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		out := mfs[:0]
		for _, mf := range mfs {
			hidden := false
			for _, p := range hiddenPrefixes {
				hidden = hidden || strings.HasPrefix(mf.GetName(), p)
			}
			if !hidden {
				out = append(out, mf)
			}
		}
		return out, err
	})
}

// Handler serves reg in the Prometheus exposition formats.
func Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(withoutHidden(reg), promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "vunet: metrics at /metrics")
	})
	return mux
}

// Listen binds addr so that a bad --metrics address fails at start-up, not
// later in a goroutine.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	return ln, nil
}

// Serve serves reg on ln until ctx ends.
func Serve(ctx context.Context, ln net.Listener, reg *prometheus.Registry, logger *slog.Logger) error {
	srv := &http.Server{Handler: Handler(reg), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	logger.Info("metrics listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics serve: %w", err)
	}
	return nil
}
