package emptydir

import (
	"context"
	"errors"
	v1 "k8s.io/api/core/v1"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/volume"
)

// WithLimits makes the plugin enforce the sizeLimit of disk emptyDirs with
// e (internal/disklimit): a project quota on the directory, or a
// filesystem image mounted at it. Without it (or with enforcement off) a
// disk emptyDir is a plain directory whatever its sizeLimit.
func (p *Plugin) WithLimits(e *disklimit.Enforcer) *Plugin {
	p.limits = e
	return p
}

// Limits is the enforcement in force (nil: none), e.g. for its Usage.
func (p *Plugin) Limits() *disklimit.Enforcer { return p.limits }

// sizeLimit is the disk emptyDir's sizeLimit in bytes, 0 when it has none.
func sizeLimit(spec *volume.Spec) int64 {
	if spec == nil || spec.Volume == nil || spec.Volume.EmptyDir == nil || spec.Volume.EmptyDir.SizeLimit == nil {
		return 0
	}
	return max(spec.Volume.EmptyDir.SizeLimit.Value(), 0)
}

// mayBeLimited tells whether a volume torn down may have an image or a
// project to release: only a disk emptyDir with a sizeLimit gets one, and
// a volume found on disk after a restart (no spec) may be one. A storm of
// Memory emptyDirs then costs no lookup of images that were never made.
func mayBeLimited(spec *volume.Spec) bool {
	if spec == nil || spec.Volume == nil || spec.Volume.EmptyDir == nil {
		return true
	}
	return spec.Volume.EmptyDir.Medium == v1.StorageMediumDefault && sizeLimit(spec) > 0
}

// mayHoldLimit is mayBeLimited answered by the request's hint when the
// volume's attributes carry one (they must agree: TestSizeLimitHint).
func mayHoldLimit(req *plugins.TearDownRequest) bool {
	return !req.NoSizeLimit && mayBeLimited(req.Spec)
}

// mountsImage tells whether the volume is set up as a mounted image (and
// so is not set up until something is mounted at its directory).
func (p *Plugin) mountsImage(spec *volume.Spec) bool {
	return p.limits.Images() != nil && sizeLimit(spec) > 0
}

// setUpDisk sets up a disk emptyDir, limited where a sizeLimit is set and
// enforcement is in force.
func (p *Plugin) setUpDisk(ctx context.Context, req *plugins.SetUpRequest) error {
	limit := sizeLimit(req.Spec)
	switch {
	case limit > 0 && p.limits.Images() != nil:
		return p.setUpImage(ctx, req, limit)
	case limit > 0 && p.limits.Projects() != nil:
		return p.setUpProject(ctx, req, limit)
	}
	return setUpDir(ctx, req)
}

func (p *Plugin) setUpImage(ctx context.Context, req *plugins.SetUpRequest, limit int64) error {
	key := disklimit.ImageKey(string(req.Pod.UID), filepath.Base(req.Dir))
	err := p.limits.Images().SetUp(ctx, req.Dir, key, limit)
	if errors.Is(err, disklimit.ErrNotEmpty) {
		// Mounting over the pod's files would hide them: the volume stays
		// unlimited until the pod goes.
		req.Log.Warn("emptyDir sizeLimit not enforced: the volume was set up without a limit and holds files", zap.String("dir", req.Dir))
		return setUpDir(ctx, req)
	}
	if err != nil {
		return err
	}
	// mkfs makes the root 0755 and root's: emptyDir is world-writable so
	// any container user can use it.
	if err := os.Chmod(req.Dir, 0o777); err != nil {
		return err
	}
	return plugins.ApplyFSGroup(ctx, req.Dir, req.Pod, false)
}

// setUpProject is setUpDir with the directory given a project of its own
// before it is renamed into place, so whatever the pod writes below it is
// charged to it.
func (p *Plugin) setUpProject(ctx context.Context, req *plugins.SetUpRequest, limit int64) error {
	projects := p.limits.Projects()
	if _, err := os.Lstat(req.Dir); err == nil {
		if _, err := projects.Assign(req.Dir, req.Dir, limit); err != nil {
			return err
		}
		return setUpDir(ctx, req)
	}
	tmp := filepath.Join(filepath.Dir(req.Dir), "."+filepath.Base(req.Dir)+".setup")
	if _, err := mountutil.EnsureDir(tmp, 0o777); err != nil {
		return err
	}
	if _, err := projects.Assign(tmp, req.Dir, limit); err != nil {
		return err
	}
	return setUpDir(ctx, req)
}

// TearDown unmounts and removes the volume (removeDir), then releases what
// its limit held: the image, or the project ID once nothing is charged to
// it any more. Both are found from the pod and directory alone, so a
// volume found on disk after a restart, whose spec is unknown, is released
// as well.
func (p *Plugin) TearDown(ctx context.Context, req *plugins.TearDownRequest) error {
	if err := p.removeDir(ctx, req); err != nil {
		return err
	}
	// Without enforcement there is nothing to release, and the spec (cold
	// in memory by the time a pod goes) is not even read; nor is it when
	// the volume's attributes already said it has no limit (the hint is
	// absent, and mayBeLimited decides, after a restart).
	im, pr := p.limits.Images(), p.limits.Projects()
	if (im == nil && pr == nil) || !mayHoldLimit(req) {
		return nil
	}
	if im != nil {
		return im.Release(disklimit.ImageKey(string(req.Pod.UID), filepath.Base(req.Dir)))
	}
	return pr.Release(req.Dir)
}
