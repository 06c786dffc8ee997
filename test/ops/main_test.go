package ops

import (
	"os"
	"testing"

	"vunet/test/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.RunMain(m)) }
