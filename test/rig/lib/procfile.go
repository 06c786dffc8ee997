package rig

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcField reads the number of a "key: number [unit]" line of a /proc
// file such as /proc/meminfo or /proc/<pid>/status.
func ProcField(path, key string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			break
		}
		return strconv.ParseInt(fs[0], 10, 64)
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}
