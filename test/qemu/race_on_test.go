//go:build race

package qemu

// raceDetector: the QMP reply gate orders go-qemu's reader after Run's copy
// through a socket, an ordering the race detector cannot see.
const raceDetector = true
