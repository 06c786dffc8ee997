package qemu

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"vunet/test/guest/initramfs"
	"vunet/test/testenv"
)

var image struct {
	once sync.Once
	img  initramfs.Image
	err  error
	took time.Duration
}

// GuestImage returns the kernel and initramfs for QEMU tests, built at most
// once per test binary and cached across runs (see package initramfs).
func GuestImage(t testing.TB) initramfs.Image {
	t.Helper()
	image.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		start := time.Now()
		image.img, image.err = initramfs.Build(ctx, initramfs.Options{})
		image.took = time.Since(start)
		if image.err == nil {
			t.Logf("guest image: kernel %s, initrd %s (from cache: %v, %v)", image.img.Kernel, image.img.Initrd, image.img.Cached, image.took.Round(time.Millisecond))
		}
	})
	if errors.Is(image.err, initramfs.ErrMissing) {
		testenv.Unavailable(t, image.err, "apt-get install linux-image-amd64 busybox-static")
	}
	if image.err != nil {
		t.Fatalf("guest image: %v", image.err)
	}
	return image.img
}
