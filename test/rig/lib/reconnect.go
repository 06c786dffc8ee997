package rig

import (
	"context"
	"errors"
	"fmt"
)

// Reconnect ends the vhost-user session and starts a new one, as a QEMU
// that restarts its back-end connection does: the bridge stops, the
// front-end closes its connection (the back-end ends the session and
// resets the guest's connections), a new front-end connects, negotiates
// with fresh guest memory and rings and is bridged to the same guest
// interface, whose addresses and routes stay. The back-end must keep
// serving after a front-end leaves (no --one-off). Only the rig's own
// front-end reconnects.
func (r *Rig) Reconnect(ctx context.Context) error {
	if r.opts.Frontend != FrontendRig || r.opts.Loopback || r.fe == nil {
		return errors.New("rig: only the rig's own front-end reconnects")
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return errors.New("rig: closed")
	}
	if r.br != nil {
		err := r.br.close()
		r.br = nil
		if err != nil {
			return fmt.Errorf("stop the bridge: %w", err)
		}
	}
	r.fe.Close()
	r.fe = nil
	ctx, cancel := context.WithTimeout(ctx, r.opts.StartTimeout)
	defer cancel()
	if err := r.connect(ctx); err != nil {
		return fmt.Errorf("reconnect: %w", err)
	}
	if err := r.startBridge(); err != nil {
		return fmt.Errorf("reconnect: %w", err)
	}
	return nil
}
