package planner

import (
	"go/build"
	"testing"
)

// forbidden are the packages the planner must not import: planning is pure,
// and what touches the machine belongs to the operations, the reconstruction
// and the housekeeping. `make lint` runs this test too.
//
// Only the package's own imports are checked: the table of operation kinds
// it reads (operations) lives with the operations' bodies, which mount.
var forbidden = map[string]bool{
	"os":                            true,
	"os/exec":                       true,
	"io/fs":                         true,
	"path/filepath":                 true,
	"syscall":                       true,
	"golang.org/x/sys/unix":         true,
	"k8s.io/mount-utils":            true,
	"github.com/moby/sys/mountinfo": true,
	"github.com/volume-agent/volume-agent/internal/mountutil": true,
	"github.com/volume-agent/volume-agent/internal/subpath":   true,
	"github.com/volume-agent/volume-agent/internal/safefs":    true,
}

func TestPlannerImportsNothingThatTouchesTheMachine(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("no imports read: the check would pass for nothing")
	}
	for _, imp := range pkg.Imports {
		if forbidden[imp] {
			t.Errorf("planner imports %s: planning must stay pure (no I/O)", imp)
		}
	}
}
