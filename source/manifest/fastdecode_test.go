package manifest

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// Which documents take the fast path; FuzzParse checks that the result is
// the decoder's whichever path a document takes.
func TestFastDecodeTakes(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want bool
	}{
		{"pod", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`, true},
		{"kind first, spaces", " {\n \"kind\" : \"Pod\" ,\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"p\"}}", true},
		{"storage group", `{"apiVersion":"storage.k8s.io/v1","kind":"CSIDriver","metadata":{"name":"d"}}`, true},
		{"as the YAML conversion writes it", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"n"}}`, true},
		{"metadata first", `{"metadata":{"name":"p"},"apiVersion":"v1","kind":"Pod"}`, false},
		{"escaped value", `{"apiVersion":"v\u0031","kind":"Pod"}`, false},
		{"same key twice", `{"kind":"Pod","kind":"Pod","metadata":{"name":"p"}}`, false},
		{"unsupported kind", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}`, false},
		{"list", `{"apiVersion":"v1","kind":"List","items":[]}`, false},
		{"unknown field", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"extra":1}`, false},
		{"duplicate kind later", `{"apiVersion":"v1","kind":"Pod","kind":"Secret"}`, false},
		{"second document", `{"apiVersion":"v1","kind":"Pod"} {"apiVersion":"v1","kind":"Pod"}`, false},
		{"truncated", `{"apiVersion":"v1","kind":"Pod","metadata":{`, false},
		{"not an object", `["apiVersion","v1"]`, false},
		{"number value", `{"apiVersion":1,"kind":"Pod"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &parser{nodeName: "node-1"}
			if _, _, got := p.fastDecode([]byte(tt.doc), sliceHint{}); got != tt.want {
				t.Errorf("fast path taken = %v, want %v", got, tt.want)
			}
			slow := &parser{nodeName: "node-1", decoderOnly: true}
			if _, _, got := slow.fastDecode([]byte(tt.doc), sliceHint{}); got {
				t.Error("fast path taken with decoderOnly")
			}
		})
	}
}

// TestSliceHint is the oracle of pre-sizing a pod's slices from its YAML:
// the pod decodes exactly as without a hint (a missing key stays nil, an
// empty one empty), and the hint is taken where it can be.
func TestSliceHint(t *testing.T) {
	const head = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
	tests := []struct {
		name                string
		doc                 string
		volumes, containers int // the hint
		presized            bool
	}{
		{"no spec", head, 0, 0, false},
		{"no keys", head + "spec: {nodeName: node-1}\n", 0, 0, false},
		{"null", head + "spec: {volumes: null, containers: null}\n", 0, 0, false},
		{"empty", head + "spec: {volumes: [], containers: []}\n", 0, 0, false},
		{"volumes only", head + "spec:\n  volumes:\n  - {name: a, emptyDir: {}}\n  - {name: b, emptyDir: {}}\n", 2, 0, true},
		{"both", head + "spec:\n  containers:\n  - name: c\n    volumeMounts: [{name: a, mountPath: /a}]\n  volumes:\n  - {name: a, emptyDir: {}}\n", 1, 1, true},
		{"not a sequence", head + "spec: {volumes: {a: b}}\n", 0, 0, false},
		{"spec not a mapping", head + "spec: [volumes]\n", 0, 0, false},
		{"wrong item", head + "spec: {volumes: [{name: a, emptyDir: {}}, 7]}\n", 2, 0, false},
		{"unknown field", head + "spec: {volumes: [{name: a, emptyDir: {}, x: 1}]}\n", 1, 0, false},
		{"not a pod", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\nspec: {volumes: [a]}\n", 1, 0, false},
		{"bench pod", string(benchPod(1)), 4, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, hint, ok := fastYAMLToJSONHint(nil, []byte(tt.doc))
			if !ok {
				t.Fatal("not converted")
			}
			if hint != (sliceHint{tt.volumes, tt.containers}) {
				t.Fatalf("hint %+v, want %d volumes, %d containers", hint, tt.volumes, tt.containers)
			}
			fast := (&parser{nodeName: "node-1"}).parse([]byte(tt.doc))
			slow := (&parser{nodeName: "node-1", decoderOnly: true}).parse([]byte(tt.doc))
			if !reflect.DeepEqual(summary(fast), summary(slow)) {
				t.Fatalf("with and without the hint differ:\n%v\n%v", summary(fast), summary(slow))
			}
			if !tt.presized {
				return
			}
			pod := fast.objects[0].obj.(*corev1.Pod)
			if cap(pod.Spec.Volumes) != tt.volumes || cap(pod.Spec.Containers) != max(tt.containers, len(pod.Spec.Containers)) {
				t.Fatalf("not pre-sized: volumes cap %d, containers cap %d", cap(pod.Spec.Volumes), cap(pod.Spec.Containers))
			}
		})
	}
}
