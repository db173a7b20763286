package volumestats

import (
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/csi/csiclient"
)

// Usage is how full a volume is, in the kubelet's six figures. A figure its
// source does not report is 0, as the kubelet exports it.
type Usage struct {
	CapacityBytes  int64
	AvailableBytes int64
	UsedBytes      int64
	Inodes         int64
	InodesFree     int64
	InodesUsed     int64
}

// Health is a driver's word on a volume's condition. It is only known for
// drivers with VOLUME_CONDITION.
type Health struct {
	Abnormal bool
	Message  string
}

// fromStatfs is the kubelet's arithmetic for a volume on a filesystem
// (MetricsStatFS, pkg/volume/util/fs.Info): every block count times
// f_bsize (not f_frsize, though the counts are in f_frsize units: where
// they differ the kubelet's numbers are what dashboards expect), used
// blocks as total minus free (f_bfree, reserved blocks included, so used +
// available < capacity on ext4), used inodes as total minus free.
func fromStatfs(st *unix.Statfs_t) Usage {
	bsize := int64(st.Bsize)
	return Usage{
		CapacityBytes:  int64(st.Blocks) * bsize,
		AvailableBytes: int64(st.Bavail) * bsize,
		UsedBytes:      (int64(st.Blocks) - int64(st.Bfree)) * bsize,
		Inodes:         int64(st.Files),
		InodesFree:     int64(st.Ffree),
		InodesUsed:     int64(st.Files) - int64(st.Ffree),
	}
}

// fromDeviceSize is the kubelet's figure for a raw block volume
// (MetricsBlock): its capacity only.
func fromDeviceSize(size int64) Usage { return Usage{CapacityBytes: size} }

// errNoUsage is the kubelet's error for a response with neither usage nor
// a condition.
var errNoUsage = errors.New("the driver reported no usage")

// fromCSI reads a NodeGetVolumeStats response as the kubelet does: bytes
// and inodes from the usage entries of those units (others are ignored),
// the condition when the driver has VOLUME_CONDITION (an absent one is a
// healthy volume), and no usage at all is an error unless the driver
// reports conditions. Unlike the kubelet, a negative figure (the spec
// forbids them) is an error rather than a huge number, and a condition
// protobuf would refuse fails the call as it does the kubelet's.
func fromCSI(resp *csi.NodeGetVolumeStatsResponse, withCondition bool) (Usage, *Health, error) {
	var u Usage
	var h *Health
	if withCondition {
		c, err := csiclient.StatsVolumeCondition(resp)
		if err != nil {
			return u, nil, err
		}
		h = &Health{}
		if c != nil {
			h.Abnormal, h.Message = c.Abnormal, c.Message
		}
	}
	usage := resp.GetUsage()
	if len(usage) == 0 && !withCondition {
		return u, nil, errNoUsage
	}
	for _, e := range usage {
		if e == nil {
			continue
		}
		if e.GetTotal() < 0 || e.GetAvailable() < 0 || e.GetUsed() < 0 {
			return Usage{}, nil, fmt.Errorf("the driver reported a negative %s usage (total %d, available %d, used %d)",
				e.GetUnit(), e.GetTotal(), e.GetAvailable(), e.GetUsed())
		}
		switch e.GetUnit() {
		case csi.VolumeUsage_BYTES:
			u.CapacityBytes, u.AvailableBytes, u.UsedBytes = e.GetTotal(), e.GetAvailable(), e.GetUsed()
		case csi.VolumeUsage_INODES:
			u.Inodes, u.InodesFree, u.InodesUsed = e.GetTotal(), e.GetAvailable(), e.GetUsed()
		}
	}
	return u, h, nil
}
