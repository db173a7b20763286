package plugins

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/volume"
)

// ApplyFSGroup gives the pod's fsGroup access to the volume at dir, the way
// the kubelet does: group ownership, group read/write (read for read-only
// volumes) and setgid on directories so new files inherit the group. With
// the OnRootMismatch policy an already-correct root means nothing is walked,
// which is what keeps large volumes fast to mount.
//
// The volume's contents belong to the pod, and another pod sharing the
// volume may change them during the walk: safefs does it on file
// descriptors, never follows a symbolic link, never leaves the volume's
// mount, and bounds its memory whatever the tree's shape.
func ApplyFSGroup(ctx context.Context, dir string, pod volume.PodInfo, readOnly bool) error {
	if pod.FSGroup == nil {
		return nil
	}
	fileBits := uint32(0o660)
	if readOnly {
		fileBits = 0o440
	}
	return safefs.SetGroup(ctx, dir, safefs.Group{
		GID:               int(*pod.FSGroup),
		FileBits:          fileBits,
		DirBits:           fileBits | 0o110 | 0o2000, // setgid
		SkipIfRootMatches: pod.FSGroupChangePolicy != nil && *pod.FSGroupChangePolicy == v1.FSGroupChangeOnRootMismatch,
	})
}
