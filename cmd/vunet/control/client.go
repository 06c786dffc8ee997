package control

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Client talks to a control endpoint (vunet ctl).
type Client struct {
	path string
	hc   *http.Client
}

// APIError is a request the endpoint refused: its HTTP status and message.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return e.Message }

// NewClient returns a client of the endpoint at the socket path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}
	return &Client{path: path, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// Forwards lists the forwarded ports open.
func (c *Client) Forwards(ctx context.Context) ([]Forward, error) {
	var out Forwards
	err := c.do(ctx, http.MethodGet, "/v1/forwards", nil, &out)
	return out.Forwards, err
}

// Add forwards the ports of spec (passt's -t/-u syntax) for proto (tcp,
// udp) and returns them as opened.
func (c *Client) Add(ctx context.Context, proto, spec string) ([]Forward, error) {
	var out Forwards
	err := c.do(ctx, http.MethodPost, "/v1/forwards", &ForwardRequest{Protocol: proto, Spec: spec}, &out)
	return out.Forwards, err
}

// Remove closes the forwarded host ports spec names and returns them.
func (c *Client) Remove(ctx context.Context, proto, spec string) ([]Forward, error) {
	var out Forwards
	err := c.do(ctx, http.MethodDelete, "/v1/forwards", &ForwardRequest{Protocol: proto, Spec: spec}, &out)
	return out.Forwards, err
}

// RemoveID closes the forward with the given ID and returns it.
func (c *Client) RemoveID(ctx context.Context, id uint64) ([]Forward, error) {
	var out Forwards
	err := c.do(ctx, http.MethodDelete, "/v1/forwards/"+strconv.FormatUint(id, 10), nil, &out)
	return out.Forwards, err
}

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var out Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &out)
	return out, err
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://vunet"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("control socket %s: %w", c.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("control socket %s: %w", c.path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e Error
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(b))
		}
		return &APIError{Status: resp.StatusCode, Message: e.Error}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("control socket %s: answer: %w", c.path, err)
	}
	return nil
}
