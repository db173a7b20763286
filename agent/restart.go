package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/agent/metrics"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/blockpin"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/trash"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/reconciler/housekeeping"
	"github.com/volume-agent/volume-agent/volume"
)

// disk is what an earlier run left on disk: the volumes it set up, which
// Run adopts into the actual state before anything else runs, and the
// trash it did not finish emptying.
type disk struct {
	paths   volume.Paths
	asw     *cache.ActualStateOfWorld
	plugins *plugins.Registry
	mounter *mountutil.Mounter
	// pins keeps raw block devices open under pods' access points.
	pins    *blockpin.Loops
	orphans *housekeeping.Orphans
	metrics *metrics.Metrics
	// period is how often the trash is looked at again (the resync
	// period).
	period time.Duration
	log    *zap.Logger
}

// emptyTrash finishes the removals an earlier run left in the trash (it
// stopped half way), then looks again every resync period; what cannot be
// removed (another mount inside) is reported as an orphan. It runs beside
// the reconciler: a huge leftover tree never holds up volumes.
func (d *disk) emptyTrash(ctx context.Context) error {
	period := d.period
	if period <= 0 {
		period = time.Minute
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		var problems []housekeeping.Problem
		for _, l := range trash.Empty(ctx, d.paths.TrashDir()) {
			problems = append(problems, housekeeping.Problem{Path: l.Path, Reason: "cannot finish deleting it: " + l.Err.Error()})
		}
		d.orphans.Set("trash", problems)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// reconstruct rebuilds the actual state from disk before anything runs, so
// the first plans see what is already mounted.
func (d *disk) reconstruct() error {
	start := time.Now()
	pins, err := d.pins.Snapshot()
	if err != nil {
		return fmt.Errorf("listing the pins of raw block volumes: %w", err)
	}
	r, err := housekeeping.Reconstruct(d.paths, d.plugins, d.mounter.IsMountPoint, func(path string) (bool, error) {
		return d.blockMapped(pins, path)
	})
	if err != nil {
		return fmt.Errorf("reconstructing state from %s: %w", d.paths.Root, err)
	}
	d.sweepPins(r)
	d.asw.AddReconstructed(r.Volumes)
	d.orphans.Set("reconstruction", r.Problems)
	pods, devices := 0, 0
	for _, v := range r.Volumes {
		pods += v.Pods.Len()
		if v.DeviceReconstructed {
			devices++
		}
	}
	d.metrics.Reconstructed(pods)
	d.log.Info("reconstructed state from disk: nothing is torn down before the sources are read completely",
		zap.Int("podVolumes", pods), zap.Int("deviceMounts", devices), zap.Int("problems", len(r.Problems)),
		zap.Duration("took", time.Since(start)))
	return nil
}

// blockMapped reports whether a raw block volume's access point holds a
// pinned block device: evidence enough, after a restart, that it is mapped.
func (d *disk) blockMapped(pins *blockpin.Snapshot, path string) (bool, error) {
	if mounted, err := d.mounter.IsMountPoint(path); err != nil || !mounted {
		// A driver may make a device node rather than a mount.
		if info, serr := os.Lstat(path); serr != nil || info.Mode().Type() != os.ModeDevice {
			return false, err
		}
	}
	return pins.Pinned(path)
}

// sweepPins releases pins below the pods directory that no reconstructed
// access point accounts for (a pin always sits on an access point, so this
// finds nothing unless something else removed one).
func (d *disk) sweepPins(r *housekeeping.Reconstruction) {
	known := map[string]bool{}
	for _, v := range r.Volumes {
		if !v.Attributes.Block {
			continue
		}
		for _, m := range v.Pods.All() {
			known[m.MountPath] = true
		}
	}
	released, err := d.pins.Sweep(d.paths.PodsDir(), func(p string) bool { return known[p] })
	if err != nil {
		d.log.Warn("cannot release pins of access points no volume accounts for", zap.Error(err))
	}
	for _, p := range released {
		d.log.Warn("released the pin of an access point no volume accounts for", zap.String("path", p))
	}
}
