package mountutil

import (
	"fmt"
	"os"
	"testing"
)

// tmpfsData writes what fmt would (mode=%#o[,size=%d][,noswap]), and a
// NUL, in one allocation.
func TestTmpfsData(t *testing.T) {
	for _, o := range []TmpfsOptions{
		{Mode: 0o777}, {Mode: 0o755 | os.ModeDir, SizeBytes: 64 << 20}, {Mode: 0, SizeBytes: 1}, {Mode: 0o1777, SizeBytes: 1 << 40}, {Mode: 0o7},
		{Mode: 0o777, SizeBytes: 1<<63 - 1},
	} {
		for _, noswap := range []bool{false, true} {
			want := fmt.Sprintf("mode=%#o", o.Mode.Perm())
			if o.SizeBytes > 0 {
				want += fmt.Sprintf(",size=%d", o.SizeBytes)
			}
			if noswap {
				want += ",noswap"
			}
			if got := string(tmpfsData(o, noswap)); got != want+"\x00" {
				t.Errorf("tmpfsData(%+v, %v) = %q, want %q", o, noswap, got, want+"\x00")
			}
			if n := testing.AllocsPerRun(10, func() { tmpfsData(o, noswap) }); n > 1 {
				t.Errorf("tmpfsData(%+v, %v): %v allocations", o, noswap, n)
			}
		}
	}
}
