package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// microPackages hold the hot-path benchmarks: ring pop/push and the
// virtio-net header (virtqueue), frame build/parse and checksums
// (tcpstack/header), the TX and RX paths (tcpstack), a TCP connection's
// data, SACK recovery and setup (tcpstack/tcp), datagram batches and the
// flow table (tcpstack/dgram), the stream transport (tcpstack/stream).
var microPackages = []string{"./virtqueue", "./tcpstack/header", "./tcpstack", "./tcpstack/tcp", "./tcpstack/dgram", "./tcpstack/stream"}

// runMicro runs the packages' Go benchmarks in the module at root and parses
// their lines. The raw output is returned too, for the log.
func runMicro(ctx context.Context, root, benchtime string) ([]MicroResult, string, error) {
	args := append([]string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-count", "1", "-benchtime", benchtime}, microPackages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	res := parseBench(out)
	if err != nil {
		return res, string(out), fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return res, string(out), nil
}

// parseBench reads `go test -bench -benchmem` output: "pkg:" lines name
// the package, "BenchmarkX-N  iters  v unit  v unit..." lines the results.
func parseBench(out []byte) []MicroResult {
	var res []MicroResult
	pkg := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		iters, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		m := MicroResult{Package: pkg, Name: f[0], Iterations: iters}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				m.NsPerOp = v
			case "B/op":
				m.BytesPerOp = v
			case "allocs/op":
				m.AllocsPerOp = v
			default:
				if m.Extra == nil {
					m.Extra = map[string]float64{}
				}
				m.Extra[f[i+1]] = v
			}
		}
		res = append(res, m)
	}
	return res
}
