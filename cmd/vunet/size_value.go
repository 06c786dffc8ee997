package main

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// sizeValue parses a byte size: a number of bytes, or a number with a
// binary suffix K, M, G or T (KiB … TiB; "KiB" and "KB" spellings too).
type sizeValue uint64

var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}}

func (v *sizeValue) String() string {
	n := uint64(*v)
	for _, u := range sizeUnits {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatUint(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}

func (v *sizeValue) Set(s string) error {
	num, shift := strings.TrimSpace(s), uint(0)
	upper := strings.ToUpper(num)
	for _, u := range sizeUnits {
		for _, suf := range []string{u.suffix + "IB", u.suffix + "B", u.suffix} {
			if strings.HasSuffix(upper, suf) {
				num, shift = num[:len(num)-len(suf)], u.shift
				break
			}
		}
		if shift != 0 {
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if err != nil || n == 0 {
		return fmt.Errorf("want a positive size such as 512G or 2T")
	}
	hi, lo := bits.Mul64(n, 1<<shift)
	if hi != 0 {
		return fmt.Errorf("size too large")
	}
	*v = sizeValue(lo)
	return nil
}
