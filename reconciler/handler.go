package reconciler

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/operations"
)

// OperatorHandler is the Handler of the agent: it turns actions into calls of
// the Operator's bodies and adopts through it.
type OperatorHandler struct {
	Operator *operations.Operator
}

// Operation implements Handler: the body of the action's kind, from the
// table of kinds, on its target.
func (h *OperatorHandler) Operation(a *Action) *operations.Operation {
	return h.Operator.Operation(a.Op, a.Target)
}

// Adopt implements Handler through the Operator.
func (h *OperatorHandler) Adopt(a Adoption) {
	pods := make(map[types.UID]cache.ActualPodMount, len(a.Pods))
	for uid, p := range a.Pods {
		pods[uid] = cache.ActualPodMount{Pod: p.Pod, Spec: p.Spec}
	}
	h.Operator.AdoptVolume(cache.VolumeIdentity{Name: a.Volume, Plugin: a.Plugin, Attributes: a.Attributes, Spec: a.Spec}, a.Device, pods)
}
