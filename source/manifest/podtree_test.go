package manifest

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// benchStormPod is a pod as test/bench writes it for the storm.
const benchStormPod = `apiVersion: v1
kind: Pod
metadata:
  name: bench-0001
  namespace: default
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: v0, mountPath: /v0}
    - {name: v1, mountPath: /v1}
  volumes:
  - name: v0
    emptyDir: {medium: Memory, sizeLimit: 1Mi}
  - name: v1
    emptyDir: {medium: Memory, sizeLimit: 1Mi}
`

// fullTreePod uses every field decodePodTree knows.
const fullTreePod = `apiVersion: v1
kind: Pod
metadata:
  name: all
  namespace: ns
  uid: u-1
  labels: {app: a, "x/y": "1"}
  annotations: {note: 'it''s "here"'}
spec:
  nodeName: node-1
  serviceAccountName: sa
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {fsGroup: 1000, runAsUser: 0, runAsGroup: -1, runAsNonRoot: true, fsGroupChangePolicy: OnRootMismatch}
  initContainers:
  - {name: init, image: busybox, command: [sh, "-c", "true"]}
  containers:
  - name: c
    image: busybox
    imagePullPolicy: Never
    workingDir: /w
    command: []
    args: [a, "b c"]
    env:
    - {name: A, value: "1"}
    - {name: B, valueFrom: {fieldRef: {fieldPath: metadata.name, apiVersion: v1}}}
    - {name: C, valueFrom: {resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}}
    resources: {limits: {memory: 64Mi, cpu: 500m}, requests: {cpu: 1, memory: "0"}}
    volumeMounts:
    - {name: e, mountPath: /e, subPath: x, readOnly: true, mountPropagation: HostToContainer}
    - {name: h, mountPath: /h, subPathExpr: $(A)}
    volumeDevices:
    - {name: b, devicePath: /dev/b}
  volumes:
  - {name: e, emptyDir: {}}
  - {name: m, emptyDir: {medium: Memory, sizeLimit: 1Gi}}
  - {name: h, hostPath: {path: /h, type: DirectoryOrCreate}}
  - {name: cm, configMap: {name: c, defaultMode: 420, optional: true, items: [{key: k, path: p, mode: 256}]}}
  - {name: s, secret: {secretName: s, items: []}}
  - {name: pvc, persistentVolumeClaim: {claimName: c, readOnly: true}}
  - name: csi
    csi: {driver: d.example.com, readOnly: true, fsType: ext4, volumeAttributes: {a: b}, nodePublishSecretRef: {name: s}}
  - name: dw
    downwardAPI: {defaultMode: 292, items: [{path: l, fieldRef: {fieldPath: metadata.labels}}, {path: m, resourceFieldRef: {resource: limits.cpu, divisor: 1m}, mode: 384}]}
  - name: pr
    projected:
      defaultMode: 420
      sources:
      - serviceAccountToken: {path: token, audience: a, expirationSeconds: 3607}
      - configMap: {name: c, optional: false, items: [{key: a, path: b}]}
      - secret: {name: s}
      - downwardAPI: {items: [{path: nsf, fieldRef: {fieldPath: metadata.namespace}}]}
  - name: b
    persistentVolumeClaim: {claimName: block}
`

// treeDecodes decodes doc with decodePodTree, nil if it does not.
func treeDecodes(t testing.TB, doc []byte) *corev1.Pod {
	t.Helper()
	_, pod, _, ok := fastYAMLToPod(nil, doc, true)
	if !ok {
		return nil
	}
	return pod
}

// checkPodTree fails if decodePodTree decodes doc to another pod than
// fastYAMLToJSON and fastDecode, and reports whether it decoded it.
func checkPodTree(t *testing.T, doc []byte) bool {
	t.Helper()
	pod := treeDecodes(t, doc)
	if pod == nil {
		return false
	}
	js, ok := fastYAMLToJSON(nil, doc)
	if !ok {
		t.Fatalf("decodePodTree took %q, which fastYAMLToJSON refuses", doc)
	}
	obj, _, ok := (&parser{}).fastDecode(js, sliceHint{})
	if !ok {
		t.Fatalf("decodePodTree took %q, which fastDecode refuses:\n%s", doc, js)
	}
	if !reflect.DeepEqual(pod, obj) {
		t.Fatalf("%q:\ntree %#v\njson %#v", doc, pod, obj)
	}
	return true
}

func TestPodTree(t *testing.T) {
	docs := map[string]string{"podYAML": podYAML, "bench storm pod": benchStormPod, "all fields": fullTreePod, "BenchmarkParsePod": string(benchPod(1))}
	for name, doc := range docs {
		if !checkPodTree(t, []byte(doc)) {
			t.Errorf("%s: not decoded from the tree", name)
		}
	}
	// The examples' pods: every one is decoded from the tree.
	files, _ := filepath.Glob("../../examples/manifests/*.yaml")
	if len(files) == 0 {
		t.Fatal("no examples")
	}
	pods := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := splitYAML(data, func(doc []byte, _ int) error {
			if checkPodTree(t, doc) {
				pods++
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		checkSameParse(t, data)
	}
	t.Logf("%d example pods decoded from the tree", pods)
}

// checkSameParse fails if parsing data with and without decodePodTree
// gives different results.
func checkSameParse(t *testing.T, data []byte) {
	t.Helper()
	got := (&parser{nodeName: "node-1"}).parse(data)
	want := (&parser{nodeName: "node-1", jsonOnly: true}).parse(data)
	if !reflect.DeepEqual(summary(got), summary(want)) {
		t.Fatalf("%q: the tree and the JSON path differ:\n%v\n%v", data, summary(got), summary(want))
	}
}

// TestPodTreeFallback lists what decodePodTree leaves to the JSON path;
// the file's outcome (object, warning or error) is the JSON path's.
func TestPodTreeFallback(t *testing.T) {
	const head = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
	for name, doc := range map[string]string{
		"another kind":          "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
		"another version":       "apiVersion: v2\nkind: Pod\nmetadata: {name: p}\n",
		"kind not a string":     "apiVersion: v1\nkind: 1\nmetadata: {name: p}\n",
		"unknown top-level key": head + "status: {phase: Running}\n",
		"unknown spec key":      head + "spec: {hostNetwork: true}\n",
		"key in another case":   head + "spec: {NodeName: node-1}\n",
		"null spec":             head + "spec:\n",
		"null string":           head + "spec: {nodeName: null}\n",
		"number for a string":   head + "spec: {nodeName: 7}\n",
		"string for a bool":     head + "spec: {automountServiceAccountToken: \"true\"}\n",
		"string for an int":     head + "spec: {securityContext: {fsGroup: \"1\"}}\n",
		"int32 overflow":        head + "spec: {volumes: [{name: c, configMap: {name: c, defaultMode: 4294967296}}]}\n",
		"null emptyDir":         head + "spec:\n  volumes:\n  - name: e\n    emptyDir:\n",
		"bad quantity":          head + "spec: {volumes: [{name: e, emptyDir: {sizeLimit: 1Mo}}]}\n",
		"quantity JSON escapes": head + "spec: {volumes: [{name: e, emptyDir: {sizeLimit: \"1<\"}}]}\n",
		"bool quantity":         head + "spec: {volumes: [{name: e, emptyDir: {sizeLimit: true}}]}\n",
		"label not a string":    "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {a: 1}}\n",
		"ephemeral volume":      head + "spec: {volumes: [{name: e, ephemeral: {}}]}\n",
		"mapping for a list":    head + "spec: {containers: {name: c}}\n",
		"null list item":        head + "spec:\n  volumes:\n  -\n",
		"unknown container key": head + "spec: {containers: [{name: c, ports: []}]}\n",
		"metadata generateName": "apiVersion: v1\nkind: Pod\nmetadata: {generateName: p-}\n",
		"sequence at the top":   "- a\n",
		"scalar at the top":     "a\n",
	} {
		t.Run(name, func(t *testing.T) {
			if pod := treeDecodes(t, []byte(doc)); pod != nil {
				t.Fatalf("decodePodTree took %q: %#v", doc, pod)
			}
			checkSameParse(t, []byte(doc))
		})
	}
}

// FuzzPodTree: whatever decodePodTree takes, it decodes as the JSON path
// does, and a file's outcome is the same with and without it.
func FuzzPodTree(f *testing.F) {
	for _, s := range []string{podYAML, benchStormPod, fullTreePod, string(benchPod(1))} {
		f.Add([]byte(s))
	}
	files, _ := filepath.Glob("../../examples/manifests/*.yaml")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkPodTree(t, data)
		checkSameParse(t, data)
	})
}

// BenchmarkParsePodTree parses the storm's pod (test/bench's, four
// Memory emptyDirs with a sizeLimit) from the tree and by JSON.
func BenchmarkParsePodTree(b *testing.B) {
	data := []byte(strings.ReplaceAll(benchStormPod, "  - name: v1\n", "  - name: v1\n    emptyDir: {medium: Memory, sizeLimit: 1Mi}\n  - name: v2\n    emptyDir: {medium: Memory, sizeLimit: 1Mi}\n  - name: v3\n"))
	for _, name := range []string{"tree", "json"} {
		b.Run(name, func(b *testing.B) {
			p := parser{nodeName: "node-1", jsonOnly: name == "json"}
			b.ReportAllocs()
			for b.Loop() {
				if r := p.parse(data); r.fatal != "" || len(r.objects) != 1 {
					b.Fatal(r.fatal)
				}
			}
		})
	}
}

// FuzzPodTreeScalar puts one scalar, as written in YAML, in places of a
// pod that hold a string, a quantity, an integer or a bool: where the
// tree decoder takes the pod, it converts the scalar as the JSON path
// does.
func FuzzPodTreeScalar(f *testing.F) {
	for _, s := range []string{"1Mi", "0", "-1", "1.5Gi", "'1Mi'", "\"1e3\"", "true", "True", "\"true\"", "null", "~", "2147483648", "abc", "' 1Mi '", "\"a\\\"b\"", "1<", "500m", "+1", "0x10", "1_000"} {
		f.Add(s)
	}
	var fields []*regexp.Regexp
	for _, name := range []string{"sizeLimit", "fsGroup", "readOnly", "mountPath", "defaultMode", "divisor", "memory", "app", "optional"} {
		fields = append(fields, regexp.MustCompile(`\b`+name+`: [^,}\n]*`))
	}
	f.Fuzz(func(t *testing.T, value string) {
		if strings.ContainsAny(value, "\n{}[],#") {
			return
		}
		for _, field := range fields {
			doc := []byte(field.ReplaceAllStringFunc(fullTreePod, func(m string) string {
				return m[:strings.Index(m, ": ")+2] + value
			}))
			checkPodTree(t, doc)
			checkSameParse(t, doc)
		}
	})
}

// TestPodTreeKeepsNoScannerMemory: what a decoded pod keeps stays as it
// was when the pooled scanner reads the next documents (ParseQuantity
// keeps a "0"'s text; repeated quantities come from decodePodTree's last
// one).
func TestPodTreeKeepsNoScannerMemory(t *testing.T) {
	doc := func(limit string) []byte {
		return []byte(strings.ReplaceAll(benchStormPod, "sizeLimit: 1Mi", "sizeLimit: "+limit))
	}
	tests := []struct{ limit, want string }{
		{`"0"`, "0"},
		{`'0'`, "0"},
		{"0", "0"},
		{"1Mi", "1Mi"},
		{`"64Mi"`, "64Mi"},
	}
	for _, tt := range tests {
		t.Run(tt.limit, func(t *testing.T) {
			pod := treeDecodes(t, doc(tt.limit))
			if pod == nil {
				t.Fatalf("decodePodTree refused sizeLimit %s", tt.limit)
			}
			for range 3 {
				treeDecodes(t, doc(`"9Gi"`))
			}
			for _, v := range pod.Spec.Volumes {
				if got := v.EmptyDir.SizeLimit.String(); got != tt.want {
					t.Errorf("volume %s: sizeLimit %q after more documents, want %q", v.Name, got, tt.want)
				}
			}
			if pod.Spec.Volumes[0].EmptyDir.SizeLimit == pod.Spec.Volumes[1].EmptyDir.SizeLimit {
				t.Error("two volumes share one sizeLimit")
			}
		})
	}
}
