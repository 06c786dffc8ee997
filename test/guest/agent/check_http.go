package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"vunet/test/guest"
)

// checkHTTP fetches vunet.http through the guest's own TCP stack, reporting
// size, digest and rate so the host can compare with what it served.
func (a *agent) checkHTTP(ctx context.Context) guest.Result {
	url := a.params.Values[guest.ParamHTTP]
	if url == "" {
		return fail("no URL: set %s", guest.ParamHTTP)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fail("request %q: %v", url, err)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	el := time.Since(start)
	r := guest.Result{Fields: map[string]string{
		"status": strconv.Itoa(resp.StatusCode),
		"bytes":  strconv.FormatInt(n, 10),
		"sha256": hex.EncodeToString(h.Sum(nil)),
		"mbps":   fmt.Sprintf("%.1f", float64(n)*8/el.Seconds()/1e6),
	}}
	if err != nil {
		r.Fields["detail"] = fmt.Sprintf("body after %d bytes: %v", n, err)
		return r
	}
	r.OK = resp.StatusCode == http.StatusOK
	return r
}
