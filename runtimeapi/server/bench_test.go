package server

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/runtimeapi/client"
	"github.com/volume-agent/volume-agent/volume"
)

// benchWorld is a ready pod with n emptyDir volumes, each mounted by two
// containers, one of them through a sub-path.
func benchWorld(n int) *world {
	w := newWorld("bench")
	var app, side []volume.ContainerMount
	for i := range n {
		name := fmt.Sprintf("v%02d", i)
		sub := volume.SubPath{Container: "side", Index: i, MountPath: "/" + name, Path: "sub"}
		u := w.volume(name, emptyDirPlugin, volume.Attributes{}, spec(name, v1.PersistentVolumeFilesystem, false), sub)
		w.mounted(u, emptyDirPlugin, volume.Attributes{}, name, cache.Mounted)
		w.asw.SetSubPaths(u, w.pod.UID, []volume.SubPath{sub})
		app = append(app, volume.ContainerMount{Volume: name, Index: i, MountPath: "/" + name})
		side = append(side, volume.ContainerMount{Volume: name, Index: i, MountPath: "/" + name, SubPath: "sub"})
	}
	w.containers = []volume.Container{{Name: "app", Type: volume.RegularContainer, Mounts: app}, {Name: "side", Type: volume.RegularContainer, Mounts: side}}
	return w
}

// BenchmarkView is the cost of computing a pod's document from snapshots.
func BenchmarkView(b *testing.B) {
	for _, n := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) {
			p, dsw, asw := benchWorld(n).snapshots()
			for b.Loop() {
				if v := View(p, dsw, asw, nil, volume.Paths{Root: "/r"}); !v.Ready {
					b.Fatal("not ready")
				}
			}
		})
	}
}

// BenchmarkGetPod is a client's GET /v1/pods/{uid} over the socket (a kept
// connection), for a pod of 10 volumes; BenchmarkWaitReady a wait on a pod
// that is already ready.
func BenchmarkGetPod(b *testing.B) {
	s, socket := servingB(b)
	w := benchWorld(10)
	publish(s, w)
	c := client.New(socket)
	b.Run("get", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Pod(b.Context(), "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("wait-ready", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Wait(b.Context(), "bench", time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
}
