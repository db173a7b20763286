package plugins

import (
	"fmt"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/volume"
)

// MountOptionsAnnotation is the deprecated PV annotation that, when present,
// takes precedence over spec.mountOptions (as in the kubelet).
const MountOptionsAnnotation = "volume.beta.kubernetes.io/mount-options"

// MountOptions returns the PV's mount options, de-duplicated and sorted.
func MountOptions(spec *volume.Spec) []string {
	if spec.PV == nil {
		return nil
	}
	var opts []string
	if a, ok := spec.PV.Annotations[MountOptionsAnnotation]; ok {
		for _, o := range strings.Split(a, ",") {
			if o = strings.TrimSpace(o); o != "" {
				opts = append(opts, o)
			}
		}
	} else {
		opts = append(opts, spec.PV.Spec.MountOptions...)
	}
	sort.Strings(opts)
	out := opts[:0]
	for i, o := range opts {
		if i == 0 || o != opts[i-1] {
			out = append(out, o)
		}
	}
	return out
}

// BindFlags turns mount options into flags a bind mount can honour. Options
// that only make sense for a filesystem mount (data options such as
// "discard" or "nfsvers=4") cannot be applied to a bind mount and are an
// error rather than silently ignored.
func BindFlags(opts []string) (flags uintptr, readOnly bool, err error) {
	for _, o := range opts {
		switch o {
		case "ro":
			readOnly = true
		case "rw", "suid", "dev", "exec", "atime", "diratime", "defaults", "bind", "rbind":
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "noatime":
			flags |= unix.MS_NOATIME
		case "nodiratime":
			flags |= unix.MS_NODIRATIME
		case "relatime":
			flags |= unix.MS_RELATIME
		case "strictatime":
			flags |= unix.MS_STRICTATIME
		default:
			return 0, false, fmt.Errorf("mount option %q cannot be applied to a bind mount", o)
		}
	}
	return flags, readOnly, nil
}
