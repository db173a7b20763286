package populator

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
)

// TestPodLimitsUndeclared is the oracle of podLimits' shortcut: wherever
// declaresLimits says nothing declares a limit, the helper's sum is
// empty, so both limits are nil; where it says something does, the
// shortcut is not taken.
func TestPodLimitsUndeclared(t *testing.T) {
	mem := v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	eph := v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("1Gi")}
	always := v1.ContainerRestartPolicyAlways
	for _, tc := range []struct {
		name     string
		spec     v1.PodSpec
		declares bool
	}{
		{"empty", v1.PodSpec{}, false},
		{"containers without resources", v1.PodSpec{Containers: []v1.Container{{Name: "a"}, {Name: "b"}}}, false},
		{"requests only", v1.PodSpec{Containers: []v1.Container{{Name: "a", Resources: v1.ResourceRequirements{Requests: mem}}}}, false},
		{"empty limits", v1.PodSpec{Containers: []v1.Container{{Name: "a", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}}}, false},
		{"pod-level requests", v1.PodSpec{Resources: &v1.ResourceRequirements{Requests: mem}}, false},
		{"container limit", v1.PodSpec{Containers: []v1.Container{{Name: "a"}, {Name: "b", Resources: v1.ResourceRequirements{Limits: mem}}}}, true},
		{"init container limit", v1.PodSpec{InitContainers: []v1.Container{{Name: "i", Resources: v1.ResourceRequirements{Limits: eph}}}}, true},
		{"sidecar limit", v1.PodSpec{InitContainers: []v1.Container{{Name: "s", RestartPolicy: &always, Resources: v1.ResourceRequirements{Limits: mem}}}}, true},
		{"pod-level limit", v1.PodSpec{Resources: &v1.ResourceRequirements{Limits: mem}}, true},
		{"overhead", v1.PodSpec{Overhead: mem, Containers: []v1.Container{{Name: "a"}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: tc.spec}
			if got := declaresLimits(pod); got != tc.declares {
				t.Fatalf("declaresLimits = %v, want %v", got, tc.declares)
			}
			if sum := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{}); !tc.declares && len(sum) > 0 {
				t.Fatalf("nothing declared, but the helper sums %v", sum)
			}
			if m, e := podLimits(pod); !tc.declares && (m != nil || e != nil) {
				t.Fatalf("podLimits = %v, %v; want nil, nil", m, e)
			}
		})
	}
}
