package ops

import (
	"os"
	"testing"

	"vunet/test/qemu"
)

func TestMain(m *testing.M) { os.Exit(qemu.RunMain(m)) }
