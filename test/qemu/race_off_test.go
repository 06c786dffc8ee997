//go:build !race

package qemu

const raceDetector = false
