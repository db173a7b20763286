package nodeinfo

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func node(annotations, labels map[string]string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-1", ResourceVersion: "7", Annotations: annotations, Labels: labels}}
}

func TestPlanNode(t *testing.T) {
	a := Driver{Name: "a.csi", NodeID: "id-a", Topology: map[string]string{"topology.a/zone": "z1"}}
	b := Driver{Name: "b.csi", NodeID: "id-b"}
	tests := []struct {
		name       string
		node       *v1.Node
		desired    Desired
		want       NodeChange
		wantFailed []string
		wantErr    string
	}{
		{
			name:    "first driver: annotation and label",
			node:    node(nil, nil),
			desired: Desired{Install: []Driver{a}},
			want: NodeChange{
				SetAnnotations: map[string]string{AnnotationNodeID: `{"a.csi":"id-a"}`},
				SetLabels:      map[string]string{"topology.a/zone": "z1"},
			},
		},
		{
			name:    "already there: nothing",
			node:    node(map[string]string{AnnotationNodeID: `{"a.csi":"id-a"}`}, map[string]string{"topology.a/zone": "z1"}),
			desired: Desired{Install: []Driver{a}},
		},
		{
			name:    "other writers' keys are kept",
			node:    node(map[string]string{AnnotationNodeID: `{"other.csi":"x"}`, "unrelated": "1"}, nil),
			desired: Desired{Install: []Driver{b}},
			want:    NodeChange{SetAnnotations: map[string]string{AnnotationNodeID: `{"b.csi":"id-b","other.csi":"x"}`}},
		},
		{
			name:    "a new node ID replaces the old",
			node:    node(map[string]string{AnnotationNodeID: `{"b.csi":"old"}`}, nil),
			desired: Desired{Install: []Driver{b}},
			want:    NodeChange{SetAnnotations: map[string]string{AnnotationNodeID: `{"b.csi":"id-b"}`}},
		},
		{
			name:    "removing the last driver deletes the annotation, labels stay",
			node:    node(map[string]string{AnnotationNodeID: `{"a.csi":"id-a"}`}, map[string]string{"topology.a/zone": "z1"}),
			desired: Desired{Remove: []string{"a.csi"}},
			want:    NodeChange{DeleteAnnotations: []string{AnnotationNodeID}},
		},
		{
			name:    "removing one of two keeps the other",
			node:    node(map[string]string{AnnotationNodeID: `{"a.csi":"id-a","b.csi":"id-b"}`}, nil),
			desired: Desired{Remove: []string{"a.csi"}},
			want:    NodeChange{SetAnnotations: map[string]string{AnnotationNodeID: `{"b.csi":"id-b"}`}},
		},
		{
			name:    "removing a driver that is not there changes nothing",
			node:    node(map[string]string{AnnotationNodeID: `{"b.csi":"id-b"}`}, nil),
			desired: Desired{Remove: []string{"a.csi"}},
		},
		{
			name:       "a topology collision with a label refuses that driver only",
			node:       node(nil, map[string]string{"topology.a/zone": "elsewhere"}),
			desired:    Desired{Install: []Driver{a, b}},
			want:       NodeChange{SetAnnotations: map[string]string{AnnotationNodeID: `{"b.csi":"id-b"}`}},
			wantFailed: []string{"a.csi"},
		},
		{
			name:    "a topology collision between two drivers refuses the second",
			node:    node(nil, nil),
			desired: Desired{Install: []Driver{a, {Name: "c.csi", NodeID: "id-c", Topology: map[string]string{"topology.a/zone": "z2"}}}},
			want: NodeChange{
				SetAnnotations: map[string]string{AnnotationNodeID: `{"a.csi":"id-a"}`},
				SetLabels:      map[string]string{"topology.a/zone": "z1"},
			},
			wantFailed: []string{"c.csi"},
		},
		{
			name:       "an empty node ID is refused",
			node:       node(nil, nil),
			desired:    Desired{Install: []Driver{{Name: "e.csi"}}},
			wantFailed: []string{"e.csi"},
		},
		{
			name:    "an annotation that is not JSON is an error, never overwritten",
			node:    node(map[string]string{AnnotationNodeID: `{not json`}, nil),
			desired: Desired{Install: []Driver{b}},
			wantErr: "not a JSON map",
		},
		{
			name:    "controller attach mode sets the annotation",
			node:    node(nil, nil),
			desired: Desired{AttachDetach: AttachDetachController},
			want:    NodeChange{SetAnnotations: map[string]string{AnnotationControllerAttachDetach: "true"}},
		},
		{
			name:    "controller attach mode corrects another value",
			node:    node(map[string]string{AnnotationControllerAttachDetach: "false"}, nil),
			desired: Desired{AttachDetach: AttachDetachController},
			want:    NodeChange{SetAnnotations: map[string]string{AnnotationControllerAttachDetach: "true"}},
		},
		{
			name:    "self attach mode removes it",
			node:    node(map[string]string{AnnotationControllerAttachDetach: "true"}, nil),
			desired: Desired{AttachDetach: AttachDetachSelf},
			want:    NodeChange{DeleteAnnotations: []string{AnnotationControllerAttachDetach}},
		},
		{
			name:    "leave means leave",
			node:    node(map[string]string{AnnotationControllerAttachDetach: "false"}, nil),
			desired: Desired{AttachDetach: AttachDetachLeave},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, failed, err := PlanNode(tt.node, tt.desired)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("change = %+v, want %+v", got, tt.want)
			}
			var names []string
			for _, f := range failed {
				names = append(names, f.Driver)
			}
			if !reflect.DeepEqual(names, tt.wantFailed) {
				t.Errorf("failed = %v (%v), want %v", names, failed, tt.wantFailed)
			}
		})
	}
}

func TestMergePatch(t *testing.T) {
	c := NodeChange{
		SetAnnotations:    map[string]string{AnnotationNodeID: `{"a":"b"}`},
		DeleteAnnotations: []string{AnnotationControllerAttachDetach},
		SetLabels:         map[string]string{"k": "v"},
	}
	raw, err := c.MergePatch("42")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"metadata": map[string]any{
		"resourceVersion": "42",
		"annotations":     map[string]any{AnnotationNodeID: `{"a":"b"}`, AnnotationControllerAttachDetach: nil},
		"labels":          map[string]any{"k": "v"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("patch = %s", raw)
	}
}

func entry(name, id string, count int32, keys ...string) storagev1.CSINodeDriver {
	e := storagev1.CSINodeDriver{Name: name, NodeID: id, TopologyKeys: keys}
	if e.TopologyKeys == nil {
		e.TopologyKeys = []string{}
	}
	if count > 0 {
		e.Allocatable = &storagev1.VolumeNodeResources{Count: ptr.To(count)}
	}
	return e
}

func TestPlanCSINode(t *testing.T) {
	a := Driver{Name: "a.csi", NodeID: "id-a", Topology: map[string]string{"k2": "x", "k1": "y"}, MaxVolumes: 16}
	tests := []struct {
		name        string
		cur         []storagev1.CSINodeDriver
		install     []Driver
		remove      []string
		want        []storagev1.CSINodeDriver
		wantChanged bool
	}{
		{
			name:        "added, topology keys sorted, count set",
			install:     []Driver{a},
			want:        []storagev1.CSINodeDriver{entry("a.csi", "id-a", 16, "k1", "k2")},
			wantChanged: true,
		},
		{
			name:    "the same entry in another key order is left alone",
			cur:     []storagev1.CSINodeDriver{entry("a.csi", "id-a", 16, "k2", "k1")},
			install: []Driver{a},
			want:    []storagev1.CSINodeDriver{entry("a.csi", "id-a", 16, "k2", "k1")},
		},
		{
			name:        "a new count replaces the entry",
			cur:         []storagev1.CSINodeDriver{entry("a.csi", "id-a", 8, "k1", "k2")},
			install:     []Driver{a},
			want:        []storagev1.CSINodeDriver{entry("a.csi", "id-a", 16, "k1", "k2")},
			wantChanged: true,
		},
		{
			name:        "no limit: no allocatable",
			cur:         []storagev1.CSINodeDriver{entry("b.csi", "id-b", 4)},
			install:     []Driver{{Name: "b.csi", NodeID: "id-b"}},
			want:        []storagev1.CSINodeDriver{entry("b.csi", "id-b", 0)},
			wantChanged: true,
		},
		{
			name:        "other entries are kept in place",
			cur:         []storagev1.CSINodeDriver{entry("z.csi", "z", 0), entry("a.csi", "old", 0)},
			install:     []Driver{a},
			want:        []storagev1.CSINodeDriver{entry("z.csi", "z", 0), entry("a.csi", "id-a", 16, "k1", "k2")},
			wantChanged: true,
		},
		{
			name:        "removed",
			cur:         []storagev1.CSINodeDriver{entry("z.csi", "z", 0), entry("a.csi", "id-a", 16, "k1", "k2")},
			remove:      []string{"a.csi"},
			want:        []storagev1.CSINodeDriver{entry("z.csi", "z", 0)},
			wantChanged: true,
		},
		{
			name:   "removing what is not there changes nothing",
			cur:    []storagev1.CSINodeDriver{entry("z.csi", "z", 0)},
			remove: []string{"a.csi"},
			want:   []storagev1.CSINodeDriver{entry("z.csi", "z", 0)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed := PlanCSINode(tt.cur, tt.install, tt.remove)
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("drivers = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEntryCapsTheCount(t *testing.T) {
	e := Entry(Driver{Name: "a", NodeID: "x", MaxVolumes: 1 << 40})
	if e.Allocatable == nil || *e.Allocatable.Count != 1<<31-1 {
		t.Errorf("allocatable = %+v, want the int32 maximum", e.Allocatable)
	}
}

func TestOwnedBy(t *testing.T) {
	n := NewCSINode(node(nil, nil))
	if !OwnedBy(n, "n1", "uid-1") {
		t.Error("a new CSINode is not owned by its node")
	}
	if OwnedBy(n, "n1", "uid-2") {
		t.Error("owned by a Node of another UID")
	}
}
