package timeline

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/operations"
	"github.com/volume-agent/volume-agent/volume"
)

var t0 = time.Date(2026, 11, 22, 3, 18, 0, 0, time.UTC)

// fakeNow returns a clock that advances one second per call.
func fakeNow() func() time.Time {
	now := t0
	return func() time.Time {
		now = now.Add(time.Second)
		return now
	}
}

func pod(uid string) volume.PodRef {
	return volume.PodRef{UID: types.UID(uid), Namespace: "default", Name: "pod-" + uid}
}

func finish(r *Ring, vol string, p volume.PodRef, op operations.Op, err error) {
	k := operations.Key{Volume: volume.UniqueName(vol), Pod: p.UID}
	r.OperationFinished(k, &operations.Operation{Name: op, Target: operations.Target{Pod: volume.PodInfo{PodRef: p}, Spec: &volume.Spec{Name: "spec-" + vol}}}, 250*time.Millisecond, err, time.Second)
}

func TestOutcomes(t *testing.T) {
	r := New(Options{Now: fakeNow()})
	p := pod("a")
	tests := []struct {
		name    string
		err     error
		want    Outcome
		wantErr string
	}{
		{"success", nil, Succeeded, ""},
		{"failure", errors.New("boom"), Failed, "boom"},
		{"uncertain", volume.Uncertain(errors.New("timed out")), Uncertain, "timed out"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			finish(r, "v", p, operations.OpMountVolume, tc.err)
			recs := r.ForPod(p.UID, nil)
			got := recs[len(recs)-1]
			if got.Outcome != tc.want || got.Error != tc.wantErr {
				t.Errorf("recorded %s %q, want %s %q", got.Outcome, got.Error, tc.want, tc.wantErr)
			}
			if got.End.Sub(got.Start) != 250*time.Millisecond || got.SpecName != "spec-v" || got.Pod != p {
				t.Errorf("record %+v: wrong start, spec name or pod", got)
			}
		})
	}
}

func TestStaleIsNotRecorded(t *testing.T) {
	r := New(Options{})
	finish(r, "v", pod("a"), operations.OpMountVolume, fmt.Errorf("wrapped: %w", operations.ErrStale))
	if r.Seq() != 0 || len(r.Recent()) != 0 {
		t.Fatalf("a stale operation was recorded: %+v", r.Recent())
	}
}

func TestForPodMergesVolumeWideOperations(t *testing.T) {
	r := New(Options{Now: fakeNow()})
	a, b := pod("a"), pod("b")
	finish(r, "shared", volume.PodRef{}, operations.OpMountDevice, nil)
	finish(r, "shared", a, operations.OpMountVolume, nil)
	finish(r, "shared", b, operations.OpMountVolume, nil)
	finish(r, "other", volume.PodRef{}, operations.OpMountDevice, nil)

	got := r.ForPod(a.UID, []volume.UniqueName{"shared"})
	if len(got) != 2 || got[0].Op != operations.OpMountDevice || got[1].Op != operations.OpMountVolume || got[1].Pod != a {
		t.Fatalf("ForPod(a) = %+v, want a's mount_device of shared then its mount_volume", got)
	}
	if !got[0].End.Before(got[1].End) || got[0].Seq >= got[1].Seq {
		t.Errorf("records are not oldest first: %+v", got)
	}
}

func TestBounds(t *testing.T) {
	r := New(Options{PerKey: 3, Keys: 2, Overall: 5, Now: fakeNow()})
	a, b, c := pod("a"), pod("b"), pod("c")
	for range 4 {
		finish(r, "v", a, operations.OpMountVolume, nil)
	}
	if got := r.ForPod(a.UID, nil); len(got) != 3 || got[0].Seq != 2 || got[2].Seq != 4 {
		t.Fatalf("per-key ring keeps %+v, want the last 3 (seq 2..4)", seqs(got))
	}
	finish(r, "v", b, operations.OpMountVolume, nil)
	finish(r, "v", a, operations.OpMountVolume, nil) // a is now the most recent
	finish(r, "v", c, operations.OpMountVolume, nil) // evicts b
	if got := r.ForPod(b.UID, nil); len(got) != 0 {
		t.Errorf("b should have been forgotten (least recently updated), has %v", seqs(got))
	}
	if got := r.ForPod(a.UID, nil); len(got) != 3 {
		t.Errorf("a lost records: %v", seqs(got))
	}
	if got := r.ForPod(c.UID, nil); len(got) != 1 {
		t.Errorf("c has %v, want one record (in a reused ring)", seqs(got))
	}
	recent := r.Recent()
	if len(recent) != 5 || recent[0].Seq != 3 || recent[4].Seq != 7 {
		t.Errorf("Recent() = %v, want seq 3..7", seqs(recent))
	}
}

func seqs(recs []Record) []uint64 {
	out := make([]uint64, len(recs))
	for i, r := range recs {
		out[i] = r.Seq
	}
	return out
}

func TestRecordingASuccessDoesNotAllocate(t *testing.T) {
	r := New(Options{PerKey: 4, Keys: 8, Overall: 16})
	p := pod("a")
	k := operations.Key{Volume: "v", Pod: p.UID}
	op := &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Pod: volume.PodInfo{PodRef: p}}}
	r.OperationFinished(k, op, time.Millisecond, nil, 0) // the pod's ring
	if n := testing.AllocsPerRun(100, func() { r.OperationFinished(k, op, time.Millisecond, nil, 0) }); n != 0 {
		t.Errorf("recording a success allocates %v times", n)
	}
}

func BenchmarkOperationFinished(b *testing.B) {
	r := New(Options{})
	ops := make([]*operations.Operation, 1000)
	keys := make([]operations.Key, len(ops))
	for i := range ops {
		p := pod(fmt.Sprint(i))
		ops[i] = &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Pod: volume.PodInfo{PodRef: p}}}
		keys[i] = operations.Key{Volume: "v", Pod: p.UID}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.OperationFinished(keys[i%len(keys)], ops[i%len(ops)], time.Millisecond, nil, 0)
	}
}

// A key's buffer grows with its records, up to PerKey: thousands of pods
// with a few operations each must not cost PerKey records each.
func TestBufferGrowsWithRecords(t *testing.T) {
	r := New(Options{PerKey: 32, Keys: 8, Overall: 16, Now: fakeNow()})
	a := pod("a")
	for n := 1; n <= 40; n++ {
		finish(r, "v", a, operations.OpMountVolume, nil)
		kr := r.keys[key{pod: a.UID}]
		if c := cap(kr.ring.buf); c > max(firstBuf, 2*n) || c > 32 {
			t.Fatalf("after %d records the buffer holds %d", n, c)
		}
		got := r.ForPod(a.UID, nil)
		if len(got) != min(n, 32) || got[len(got)-1].Seq != uint64(n) || got[0].Seq != uint64(max(1, n-31)) {
			t.Fatalf("after %d records ForPod has %v", n, seqs(got))
		}
	}
}

// BenchmarkStorm records what a storm of new pods does: 1000 pods, each
// four volumes mounted and unmounted, on a fresh Ring per iteration.
func BenchmarkStorm(b *testing.B) {
	const pods, volumes = 1000, 4
	ops := make([]*operations.Operation, pods)
	keys := make([]operations.Key, pods*volumes)
	for i := range ops {
		p := pod(fmt.Sprint(i))
		ops[i] = &operations.Operation{Name: operations.OpMountVolume, Target: operations.Target{Pod: volume.PodInfo{PodRef: p}}}
		for v := range volumes {
			keys[i*volumes+v] = operations.Key{Volume: volume.UniqueName(fmt.Sprint("v", v)), Pod: p.UID}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		r := New(Options{})
		for range 2 {
			for i, k := range keys {
				r.OperationFinished(k, ops[i/volumes], time.Millisecond, nil, 0)
			}
		}
	}
}
