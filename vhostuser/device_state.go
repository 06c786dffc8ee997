package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"vunet/virtqueue"
)

// The device-state channel of a migration (spec, "Migrating back-end
// state"; VHOST_USER_PROTOCOL_F_DEVICE_STATE): on the source, after the
// rings stopped, SET_DEVICE_STATE_FD hands the back-end the writing end of
// a pipe and the data plane writes its state into it; on the destination,
// before the rings start, the reading end, and the data plane reads the
// state to its end. CHECK_DEVICE_STATE then asks whether that went well.
// The transfer runs on a goroutine of its own: the front-end reads (or
// writes) the pipe while it waits for nothing else from us. QEMU 7.2 does
// not speak this; newer QEMUs do.

// sizeDeviceState is the device state transfer parameters: u32 direction,
// u32 migration phase.
const sizeDeviceState = 8

// Transfer directions and the one migration phase.
const (
	stateSave          = 0
	stateLoad          = 1
	statePhaseStopped  = 0
	deviceStateNoFD    = 1 << 8 // reply: no back-end fd returned
	deviceStateTimeout = 60 * time.Second
)

// setDeviceStateFD starts a state transfer over the fd of m.
func (d *device) setDeviceStateFD(m *Message) ([]byte, error) {
	if d.protocol&ProtocolDeviceState == 0 {
		return nil, fmt.Errorf("DEVICE_STATE not negotiated: %w", ErrInvalid)
	}
	dir, phase := binary.LittleEndian.Uint32(m.Payload), binary.LittleEndian.Uint32(m.Payload[4:])
	if (dir != stateSave && dir != stateLoad) || phase != statePhaseStopped {
		return nil, fmt.Errorf("device state transfer: direction %d, phase %d: %w", dir, phase, ErrInvalid)
	}
	st, ok := d.dp.(virtqueue.StateTransfer)
	if !ok {
		return nil, fmt.Errorf("device state: the data plane has none: %w", ErrUnsupported)
	}
	if d.transfer != nil {
		return nil, fmt.Errorf("device state transfer already under way: %w", ErrInvalid)
	}
	for _, running := range d.running {
		if running {
			return nil, fmt.Errorf("device state transfer with rings running: %w", ErrInvalid)
		}
	}
	f := os.NewFile(uintptr(m.takeFD(0)), "device-state")
	done := make(chan error, 1)
	d.transfer = done
	go func() {
		var err error
		if dir == stateSave {
			err = st.SaveState(f)
		} else {
			err = st.LoadState(f)
		}
		if cerr := f.Close(); err == nil && dir == stateSave {
			err = cerr
		}
		done <- err
	}()
	d.log.Info("vhost-user device state transfer started", "direction", map[uint32]string{stateSave: "save", stateLoad: "load"}[dir])
	return EncodeU64(d.out[:0], deviceStateNoFD), nil
}

// checkDeviceState answers CHECK_DEVICE_STATE: 0 once the transfer
// succeeded, 1 if it failed, there was none, or it did not end in time.
func (d *device) checkDeviceState() ([]byte, error) {
	if d.transfer == nil {
		return nil, errors.New("no device state transfer")
	}
	done := d.transfer
	d.transfer = nil
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("device state transfer: %w", err)
		}
	case <-time.After(deviceStateTimeout):
		return nil, fmt.Errorf("device state transfer still running after %v", deviceStateTimeout)
	}
	d.log.Info("vhost-user device state transfer done")
	return EncodeU64(d.out[:0], 0), nil
}
