package operations_test

import (
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/volume-agent/volume-agent/agent/burst"
	"github.com/volume-agent/volume-agent/agent/metrics"
	"github.com/volume-agent/volume-agent/agent/opreport"
	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/emptydir"
	"github.com/volume-agent/volume-agent/ui/timeline"
	"github.com/volume-agent/volume-agent/volume"
)

// observers fan out as the agent's operationObservers do.
type observers []operations.Observer

func (o observers) OperationFinished(key operations.Key, op *operations.Operation, took time.Duration, err error, retryIn time.Duration) {
	for _, x := range o {
		x.OperationFinished(key, op, took, err, retryIn)
	}
}

type done struct{ wg *sync.WaitGroup }

func (d done) OperationFinished(_ operations.Key, _ *operations.Operation, _ time.Duration, err error, _ time.Duration) {
	if err != nil {
		panic(err)
	}
	d.wg.Done()
}

// BenchmarkEmptyDirCycle runs what a storm runs per emptyDir: mount_volume
// and unmount_volume of a (disk) emptyDir through the executor and the
// operator, with the agent's observers (metrics, trimmer, timeline, the
// operation report through the JSON encoder at info level). The plugin's
// syscalls (mkdir, rmdir, lstat, on tmpfs) are in it. An iteration is 64 volumes'
// cycles (two operations each); allocs/op divided by 64 is per volume.
func BenchmarkEmptyDirCycle(b *testing.B) {
	clk := clock.RealClock{}
	// On tmpfs where there is one: the root disk's mkdirs would be most of
	// what it measures.
	root, err := os.MkdirTemp("/dev/shm", "cycle")
	if err != nil {
		root = b.TempDir()
	}
	b.Cleanup(func() { _ = os.RemoveAll(root) })
	paths := volume.Paths{Root: root}
	host := plugins.Host{Paths: paths, Mounter: mountutil.New(), NodeName: "node", HostRoot: "/", Log: zap.NewNop()}
	asw := cache.NewActualStateOfWorld(clk)
	o := &operations.Operator{Plugins: plugins.NewRegistry(emptydir.New(host)), ASW: asw, DSW: cache.NewDesiredStateOfWorld(clk),
		Paths: paths, Log: zap.NewNop()}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
	var wg sync.WaitGroup
	e := operations.NewExecutor(operations.ExecutorOptions{Observer: observers{metrics.New(), burst.NewTrimmer(burst.TrimmerOptions{}),
		timeline.New(timeline.Options{}), opreport.New(opreport.Options{Log: log}), done{&wg}}})
	const pods = 64
	targets := make([]operations.Target, pods)
	for i := range targets {
		pod := volume.PodInfo{PodRef: volume.PodRef{Namespace: "default", Name: fmt.Sprintf("pod-%04d", i),
			UID: types.UID(fmt.Sprintf("0b6c2f1e-7d1a-4c55-9a51-%012d", i))}}
		targets[i] = operations.Target{Volume: volume.PodScopedName(emptydir.Name, pod.UID, "scratch"), Plugin: emptydir.Name,
			Spec: &volume.Spec{Name: "scratch", Volume: &v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}},
			Pod:  pod, SpecName: "scratch", ContentGeneration: 1,
			MountPath: paths.PodVolumeDir(pod.UID, emptydir.Name, "scratch")}
	}
	run := func(op operations.Op) {
		wg.Add(pods)
		for _, t := range targets {
			if err := e.Run(t.Key(), o.Operation(op, t)); err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
		// The planner's next pass forgets what finished, as in a storm.
		e.Startable(nil, e.Mark())
	}
	b.ReportAllocs()
	for b.Loop() {
		run(operations.OpMountVolume)
		run(operations.OpUnmountVolume)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pods), "ns/volume")
}
