package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"vunet/tcpstack"
	"vunet/tcpstack/handover"
	"vunet/tcpstack/hostsock"
)

// migrateDialTimeout bounds the destination's start-up connection to the
// source vunet.
const migrateDialTimeout = 10 * time.Second

// setUpMigration opens the hand-over channel of a live migration on this
// host, at start-up (before privileges are dropped, like every other path
// vunet touches): --migrate-to listens for the destination vunet for the
// daemon's whole life, --migrate-from connects to the source's socket now
// and fails the start-up if nobody answers, so a wrong path is an error
// the caller sees at once rather than connections lost in the migration.
func setUpMigration(ctx context.Context, o *options, stack *tcpstack.Stack, logger *slog.Logger) error {
	if o.migrateFrom != "" {
		dctx, cancel := context.WithTimeout(ctx, migrateDialTimeout)
		defer cancel()
		c, err := handover.Dial(dctx, o.migrateFrom)
		if err != nil {
			return fmt.Errorf("--migrate-from: %w", err)
		}
		stack.MigrateFrom(c)
		logger.Info("migration: connected to the source vunet; the guest's flows are taken over when it arrives", "source", o.migrateFrom)
	}
	if o.repairPath != "" && o.repairPath != "none" {
		h, err := hostsock.ListenRepair(o.repairPath)
		if err != nil {
			return fmt.Errorf("--repair-path: %w", err)
		}
		// Like --migrate-to's, the file is the keeper's to remove when
		// the sandbox is on.
		if o.sandbox != "off" {
			h.LeaveFile()
		}
		context.AfterFunc(ctx, func() {
			h.Close()
			if o.sandbox == "off" {
				os.Remove(o.repairPath)
			}
		})
		stack.SetRepairHelper(h)
		logger.Info("migration: waiting for the TCP_REPAIR helper", "socket", o.repairPath)
	}
	if o.migrateTo != "" {
		l, err := handover.Listen(o.migrateTo)
		if err != nil {
			return fmt.Errorf("--migrate-to: %w", err)
		}
		// The listener lives as long as the daemon; its file goes with it
		// (removed by the sandbox's keeper unless the sandbox is off: the
		// confined daemon may unlink nothing).
		if o.sandbox != "off" {
			l.SetUnlinkOnClose(false)
		}
		context.AfterFunc(ctx, func() {
			l.Close()
			if o.sandbox == "off" {
				os.Remove(o.migrateTo)
			}
		})
		stack.ServeMigration(l)
	}
	return nil
}
