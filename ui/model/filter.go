package model

import (
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/volume"
)

// Filter narrows a page to some pods. Zero fields match everything.
type Filter struct {
	Namespace string
	// Pod matches pods whose name contains it.
	Pod string
	// State matches pods with a volume in that state, or in any state
	// but mounted for "not-ready".
	State string
}

// NotReady is the Filter.State of every volume that is not ready.
const NotReady = "not-ready"

// IsZero reports whether f matches everything.
func (f Filter) IsZero() bool { return f == Filter{} }

func (f Filter) matchesPod(p *Pod) bool {
	if f.Namespace != "" && p.Namespace != f.Namespace {
		return false
	}
	if f.Pod != "" && !strings.Contains(p.Name, f.Pod) {
		return false
	}
	if f.State == "" {
		return true
	}
	for _, v := range p.Volumes {
		if string(v.State) == f.State || (f.State == NotReady && !v.Ready) {
			return true
		}
	}
	return f.State == string(p.State)
}

// Filtered returns a copy of p with the pods f matches, their operations
// and their events (node-wide parts stay). The summary still counts the
// whole node.
func (p *Page) Filtered(f Filter) *Page {
	if f.IsZero() {
		return p
	}
	out := *p
	out.Pods = []Pod{}
	// The pods and volumes shown.
	pods, vols := map[types.UID]bool{}, map[volume.UniqueName]bool{}
	names := map[string]bool{}
	for i := range p.Pods {
		if f.matchesPod(&p.Pods[i]) {
			out.Pods = append(out.Pods, p.Pods[i])
			pods[p.Pods[i].UID] = true
			names[p.Pods[i].String()] = true
			for _, v := range p.Pods[i].Volumes {
				vols[v.Volume] = true
			}
		}
	}
	out.Operations = []Operation{}
	for _, o := range p.Operations {
		if (o.Pod != nil && pods[o.Pod.UID]) || (o.Pod == nil && vols[o.Volume]) {
			out.Operations = append(out.Operations, o)
		}
	}
	out.Events = []events.Event{}
	for _, e := range p.Events {
		if e.Object.Kind == "Pod" && names[e.Object.Namespace+"/"+e.Object.Name] {
			out.Events = append(out.Events, e)
		}
	}
	return &out
}
