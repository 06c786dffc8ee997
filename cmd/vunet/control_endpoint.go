package main

import (
	"context"
	"log/slog"

	"vunet/cmd/vunet/control"
	"vunet/tcpstack"
)

// startControl serves the control endpoint (--control PATH, package
// control) on stack until ctx ends.
func startControl(ctx context.Context, o *options, sc *stackConfig, stack *tcpstack.Stack, logger *slog.Logger) (*control.Server, error) {
	srv, err := control.Listen(control.Config{
		Path:                  o.control,
		Mode:                  o.controlMode,
		Families:              families(sc),
		QueuePairs:            o.queues,
		UnprivilegedPortStart: unprivilegedPortStart(),
		Logger:                logger,
	}, stack)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := srv.Serve(ctx); err != nil {
			logger.Error("control endpoint stopped", "err", err)
		}
	}()
	return srv, nil
}

// families are the guest's address families, for forwards without a bind
// address.
func families(sc *stackConfig) control.Families {
	return control.Families{Disable4: sc.cfg.Addr.Disable4, Disable6: sc.cfg.Addr.Disable6}
}
