package e2eutil

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Pair is a claim and the PersistentVolume bound to it, made in their
// bound state (BindPair) as the PV controller leaves them: for suites and
// benchmarks that make thousands and run no PV binder.
type Pair struct {
	Namespace, Claim, Volume string
	// Source is the volume's source (a local path for mountable ones).
	Source corev1.PersistentVolumeSource
	// Node, if set, is the node the volume is pinned to
	// (kubernetes.io/hostname).
	Node string
	// Status also writes both objects' status (phase Bound), as the PV
	// controller would: two more writes per pair.
	Status bool
}

// BindPair creates the claim (naming the volume) and the volume (claimRef
// with the claim's UID), and with Status their Bound phases.
func BindPair(ctx context.Context, c kubernetes.Interface, p Pair) error {
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Claim,
			Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:  p.Volume, StorageClassName: new(string),
		},
	}
	claim, err := c.CoreV1().PersistentVolumeClaims(p.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating claim %s/%s: %w", p.Namespace, p.Claim, err)
	}
	pv := PreBoundPV(p.Volume, "1Gi", "", p.Namespace, p.Claim, p.Source)
	pv.Spec.ClaimRef.UID = claim.UID
	if p.Node != "" {
		pv.Spec.NodeAffinity = NodeAffinity(corev1.LabelHostname, p.Node)
	}
	pv, err = c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating volume %s: %w", p.Volume, err)
	}
	if !p.Status {
		return nil
	}
	pv.Status.Phase = corev1.VolumeBound
	if _, err := c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("volume %s status: %w", p.Volume, err)
	}
	claim.Status.Phase = corev1.ClaimBound
	claim.Status.AccessModes = claim.Spec.AccessModes
	claim.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	if _, err := c.CoreV1().PersistentVolumeClaims(p.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("claim %s/%s status: %w", p.Namespace, p.Claim, err)
	}
	return nil
}

// BindPairs makes the pairs from workers goroutines with a client of
// cfg's credentials that the client side does not throttle, and reports
// progress to progress (may be nil) every 1000 pairs.
func BindPairs(ctx context.Context, cfg *rest.Config, pairs []Pair, workers int, progress func(done int)) error {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(pairs) || ctx.Err() != nil {
					return
				}
				if err := BindPair(ctx, c, pairs[i]); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				if n := done.Add(1); progress != nil && n%1000 == 0 {
					progress(int(n))
				}
			}
		})
	}
	wg.Wait()
	return first
}
