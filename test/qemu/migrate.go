package qemu

import (
	"context"
	"fmt"
	"time"
)

// MigrationInfo is what query-migrate says about a finished migration.
type MigrationInfo struct {
	Status    string `json:"status"`
	TotalTime int64  `json:"total-time"` // ms
	Downtime  int64  `json:"downtime"`   // ms, the guest stopped
	SetupTime int64  `json:"setup-time"` // ms
	ErrorDesc string `json:"error-desc"`
	RAM       struct {
		Transferred int64 `json:"transferred"`
		DirtySyncs  int64 `json:"dirty-sync-count"`
	} `json:"ram"`
}

// Migrate migrates vm's guest to a destination QEMU waiting on uri
// (VMConfig.Incoming), with QMP "migrate", and polls query-migrate until
// the migration completes or fails. Done is when it was first seen
// completed. An error means it did not complete.
func (vm *VM) Migrate(ctx context.Context, uri string) (info MigrationInfo, done time.Time, err error) {
	if _, err := vm.QMP.Run(ctx, "migrate", map[string]any{"uri": uri}); err != nil {
		return info, done, err
	}
	for {
		if err := vm.QMP.RunInto(ctx, "query-migrate", nil, &info); err != nil {
			return info, done, err
		}
		switch info.Status {
		case "completed":
			return info, time.Now(), nil
		case "failed", "cancelled":
			return info, done, fmt.Errorf("migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return info, done, fmt.Errorf("migration still %q: %w", info.Status, ctx.Err())
		case <-vm.exited:
			return info, done, fmt.Errorf("source QEMU exited during the migration (%v)", vm.exitErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
