// Command ownership-peer runs the kubelet's own fsGroup ownership code
// (volume.NewVolumeOwnership(...).ChangePermissions() from k8s.io/kubernetes)
// on a directory and prints how long it took, so test/bench can compare the
// agent's walk with it on the same tree.
//
//	ownership-peer -dir DIR -gid GID [-readonly] [-on-root-mismatch]
//
// It prints one line: "ownership-peer <nanoseconds>".
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/volume"
)

// mounter is the least of a volume.Mounter ChangePermissions asks of: its
// path and whether it is read-only.
type mounter struct {
	volume.MetricsNil
	dir      string
	readOnly bool
}

func (m *mounter) GetPath() string                          { return m.dir }
func (m *mounter) SetUp(volume.MounterArgs) error           { return nil }
func (m *mounter) SetUpAt(string, volume.MounterArgs) error { return nil }
func (m *mounter) GetAttributes() volume.Attributes         { return volume.Attributes{ReadOnly: m.readOnly} }

func main() {
	dir := flag.String("dir", "", "the volume's directory")
	gid := flag.Int64("gid", 0, "the pod's fsGroup")
	readOnly := flag.Bool("readonly", false, "a read-only volume (group read, not read/write)")
	onRootMismatch := flag.Bool("on-root-mismatch", false, "fsGroupChangePolicy: OnRootMismatch")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "ownership-peer: -dir is required")
		os.Exit(2)
	}
	var policy *v1.PodFSGroupChangePolicy
	if *onRootMismatch {
		p := v1.FSGroupChangeOnRootMismatch
		policy = &p
	}
	m := &mounter{dir: *dir, readOnly: *readOnly}
	start := time.Now()
	err := volume.NewVolumeOwnership(m, *dir, gid, policy, nil).ChangePermissions()
	elapsed := time.Since(start)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ownership-peer:", err)
		os.Exit(1)
	}
	fmt.Printf("ownership-peer %d\n", elapsed.Nanoseconds())
}
