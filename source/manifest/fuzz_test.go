package manifest

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/volume-agent/volume-agent/volume"
)

// FuzzParse feeds the manifest decoder arbitrary files: YAML, JSON,
// neither. Whatever the input, parsing does not panic, gives the same
// result twice, and a usable file yields only objects the agent can build
// paths from: names and namespaces that are valid Kubernetes names, pod
// UIDs that are a single path element, pod volume names that are safe
// directory names, and no pod of another node.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		podYAML,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","uid":"u-1"},"spec":{"volumes":[{"name":"v","emptyDir":{}}]}}`,
		`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pv"}}]}`,
		"apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: a}\n  spec: {nodeName: node-1}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: ..}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: \"a/b\"}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  volumes:\n  - {name: ../x, emptyDir: {}}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: other}\nspec: {nodeName: node-2}\n",
		"apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: CSI.Example.COM}\n",
		"---\n---\n",
		"{\"apiVersion\":\"v1\"",
		"\xef\xbb\xbf{}",
		"a: &a [*a, *a]\nb: *a\n",
		// The fast path's edges: key order, escapes, duplicates, trailing
		// documents, unknown fields, unsupported kinds.
		`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}`,
		`{"apiVersion":"v\u0031","kind":"Pod","metadata":{"name":"p"}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"kind":"Secret"}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"Kind":"Secret"}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}{"apiVersion":"v1","kind":"Pod","metadata":{"name":"q"}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"volumez":[]}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","name":"q"}}`,
		`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}`,
		`{"apiVersion":"apps/v1/x","kind":"Pod","metadata":{"name":"p"}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":7}}`,
		` {"apiVersion" : "v1" , "kind" : "ConfigMap", "metadata":{"name":"c"},"data":{"a":"b"}}`,
		"apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {a: b}\n",
		// Pods decodePodTree reads.
		benchStormPod,
		fullTreePod,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &parser{nodeName: "node-1"}
		res := p.parse(data)
		if again := p.parse(data); !reflect.DeepEqual(summary(res), summary(again)) {
			t.Fatalf("two parses differ:\n%v\n%v", summary(res), summary(again))
		}
		slow := &parser{nodeName: "node-1", decoderOnly: true}
		if want := slow.parse(data); !reflect.DeepEqual(summary(res), summary(want)) {
			t.Fatalf("the fast path and the decoder differ:\n%v\n%v", summary(res), summary(want))
		}
		if res.fatal != "" {
			if len(res.objects) != 0 {
				t.Fatalf("fatal %q but %d objects", res.fatal, len(res.objects))
			}
			return
		}
		for _, o := range res.objects {
			if o.name == "" || len(validation.IsDNS1123Subdomain(strings.ToLower(o.name))) > 0 {
				t.Fatalf("%s: invalid name %q", o.kind, o.name)
			}
			pod, ok := o.obj.(*corev1.Pod)
			if !ok {
				continue
			}
			if len(validation.IsDNS1123Label(o.ns)) > 0 {
				t.Fatalf("pod %s: invalid namespace %q", o.name, o.ns)
			}
			if pod.Spec.NodeName != "" && pod.Spec.NodeName != "node-1" {
				t.Fatalf("pod %s/%s of node %q kept", o.ns, o.name, pod.Spec.NodeName)
			}
			uid := string(pod.UID)
			if dir := filepath.Join("/root/pods", uid); uid == "" || filepath.Dir(dir) != "/root/pods" || filepath.Base(dir) != uid {
				t.Fatalf("pod %s/%s: UID %q is not a single path element", o.ns, o.name, uid)
			}
			for _, v := range pod.Spec.Volumes {
				if err := volume.ValidatePathElement(v.Name); err != nil {
					t.Fatalf("pod %s/%s: volume name: %v", o.ns, o.name, err)
				}
			}
		}
	})
}

// summary is what FuzzParse compares between two parses: objects are
// compared by kind, key and content.
func summary(res parsed) []any {
	out := []any{res.fatal, res.warnings, res.ignored}
	for _, o := range res.objects {
		out = append(out, o.kind, o.ns, o.name, o.loc, o.obj)
	}
	return out
}
