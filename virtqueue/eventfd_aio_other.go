//go:build linux && !(amd64 || arm64)

package virtqueue

import "errors"

// aioRequest is empty where the AIO layout is not written out: eventfd
// writes always take the poll-then-write fallback.
type aioRequest struct{}

func (*aioRequest) signal(uintptr, int) error { return errors.New("no AIO on this architecture") }

func (*aioRequest) signalTwo(uintptr, int, *aioRequest, int) (int, error) {
	return 0, errors.New("no AIO on this architecture")
}

func aioSetup() (uintptr, error) {
	return 0, errors.New("AIO eventfd signals not implemented on this architecture")
}
