package mountutil

import (
	"fmt"
	"os"
	"testing"
)

// tmpfsData writes what fmt would (mode=%#o[,size=%d]), in one allocation.
func TestTmpfsData(t *testing.T) {
	for _, o := range []TmpfsOptions{
		{Mode: 0o777}, {Mode: 0o755 | os.ModeDir, SizeBytes: 64 << 20}, {Mode: 0, SizeBytes: 1}, {Mode: 0o1777, SizeBytes: 1 << 40}, {Mode: 0o7},
	} {
		want := fmt.Sprintf("mode=%#o", o.Mode.Perm())
		if o.SizeBytes > 0 {
			want += fmt.Sprintf(",size=%d", o.SizeBytes)
		}
		if got := tmpfsData(o); got != want {
			t.Errorf("tmpfsData(%+v) = %q, want %q", o, got, want)
		}
		if n := testing.AllocsPerRun(10, func() { tmpfsData(o) }); n > 1 {
			t.Errorf("tmpfsData(%+v): %v allocations", o, n)
		}
	}
}
