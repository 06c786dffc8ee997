package vhostuser

import "vunet/virtqueue"

// noteRingStopped tells the data plane, once, that the front-end stopped
// the device while it migrates the guest: QEMU's stop-and-copy sends
// GET_VRING_BASE per ring while VHOST_F_LOG_ALL is negotiated (a pause or
// a shutdown outside a migration has no LOG_ALL), and once no pair runs
// any more the guest's side is frozen. A network data plane hands its
// flows to the destination's then (virtqueue.Migrator).
func (d *device) noteRingStopped() {
	if d.features&FeatureLogAll == 0 || d.migrationStopped {
		return
	}
	for _, running := range d.running {
		if running {
			return
		}
	}
	d.migrationStopped = true
	if m, ok := d.dp.(virtqueue.Migrator); ok {
		d.log.Info("vhost-user rings stopped during a migration")
		m.MigrationStopped()
	}
}
