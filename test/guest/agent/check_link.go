package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"vunet/test/guest"
)

// checkLink proves the TX path end to end: the guest's virtio-net driver
// counts tx_packets only when the back-end returns the buffers as used, so
// a rising counter means the daemon consumed our frames.
func (a *agent) checkLink(ctx context.Context) guest.Result {
	if err := waitFor(ctx, ifName+" to appear", func() bool {
		_, err := os.Stat("/sys/class/net/" + ifName)
		return err == nil
	}); err != nil {
		return fail("%v", err)
	}
	_ = setUp("lo")
	if err := writeSysctls(a.params.Values[guest.ParamSysctl]); err != nil {
		return fail("%v", err)
	}
	if err := setUp(ifName); err != nil {
		return fail("%v", err)
	}
	if err := waitFor(ctx, ifName+" carrier", func() bool {
		s, _ := sysNet(ifName, "carrier")
		return s == "1"
	}); err != nil {
		return fail("%v", err)
	}
	mac, _ := sysNet(ifName, "address")
	mtu, _ := sysNet(ifName, "mtu")
	feats, _ := sysNet(ifName, "device/features")
	res := guest.Result{Fields: map[string]string{"mac": mac, "mtu": mtu, "features": feats}}
	if addr := a.params.Values[guest.ParamAddr]; addr != "" {
		if out, err := exec.CommandContext(ctx, "/bin/ip", "addr", "add", addr, "dev", ifName).CombinedOutput(); err != nil {
			res.Fields["detail"] = fmt.Sprintf("ip addr add %s: %v: %s", addr, err, out)
			return res
		}
		res.Fields["addr"] = addr
	}

	pc, err := openPacket(ifName, 0)
	if err != nil {
		res.Fields["detail"] = err.Error()
		return res
	}
	defer pc.Close()
	before := statCounter(ifName, "tx_packets")
	n := a.params.TXFrames
	sent := 0
	for i := 0; i < n; i++ {
		f := probeFrame(pc.mac, []byte(fmt.Sprintf("VUNET-PROBE %d", i)))
		if err := pc.send(f); err != nil {
			res.Fields["detail"] = fmt.Sprintf("send frame %d: %v", i, err)
			break
		}
		sent++
	}
	res.Fields["sent"] = strconv.Itoa(sent)
	// Completion can trail the send by one interrupt; give it a few seconds.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	werr := waitFor(wctx, "tx completion", func() bool {
		return statCounter(ifName, "tx_packets")-before >= uint64(sent)
	})
	for _, c := range []string{"tx_packets", "tx_bytes", "tx_dropped", "rx_packets", "rx_bytes"} {
		res.Fields[c] = strconv.FormatUint(statCounter(ifName, c), 10)
	}
	if sent == n && werr == nil {
		res.OK = true
		res.Fields["detail"] = fmt.Sprintf("%s up, %d frames sent and completed", ifName, sent)
	} else if werr != nil {
		res.Fields["detail"] = fmt.Sprintf("%d frames sent, tx_packets rose by %d: %v", sent, statCounter(ifName, "tx_packets")-before, werr)
	}
	return res
}

// writeSysctls writes list's PATH=VALUE entries (comma-separated) under
// /proc/sys.
func writeSysctls(list string) error {
	for _, kv := range strings.Split(list, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.Contains(k, "..") {
			return fmt.Errorf("%s: want PATH=VALUE, got %q", guest.ParamSysctl, kv)
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", k, v, err)
		}
	}
	return nil
}
