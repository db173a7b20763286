package manifest

import (
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

const podYAML = `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - name: scratch
      mountPath: /scratch
  volumes:
  - name: scratch
    emptyDir: {}
`

func TestParse(t *testing.T) {
	type want struct {
		objects  []string // "Kind ns/name" or "Kind name"
		warnings []string // substrings, one per warning
		fatal    string   // substring; "" means the file is usable
		ignored  int
	}
	tests := []struct {
		name string
		in   string
		want want
	}{
		{
			name: "multi-document YAML",
			in: podYAML + `---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: team}
spec: {volumeName: pv1}
--- # a comment after the separator
# an empty document
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv1}
spec: {claimRef: {name: data, namespace: team}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: fast}
provisioner: example.com/csi
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: example.com}
`,
			want: want{objects: []string{"Pod default/web", "PersistentVolumeClaim team/data", "PersistentVolume pv1", "StorageClass fast", "CSIDriver example.com"}},
		},
		{
			name: "JSON",
			in:   `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"ns"},"spec":{"containers":[{"name":"c","image":"i"}]}}`,
			want: want{objects: []string{"Pod ns/j"}},
		},
		{
			name: "JSON stream",
			in: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{}}
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{}}`,
			want: want{objects: []string{"Pod default/a", "Pod default/b"}},
		},
		{
			name: "JSON stream broken after the first object",
			in: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{}}
{"apiVersion":"v1",`,
			want: want{fatal: "document 2: invalid JSON"},
		},
		{
			name: "YAML flow mapping",
			in:   `{apiVersion: v1, kind: Pod, metadata: {name: flow}}`,
			want: want{objects: []string{"Pod default/flow"}},
		},
		{
			name: "v1 List",
			in: `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: p1}
- apiVersion: storage.k8s.io/v1
  kind: CSIDriver
  metadata: {name: d.example.com}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: nope}
`,
			want: want{
				objects:  []string{"Pod default/p1", "CSIDriver d.example.com"},
				warnings: []string{`document 1 (line 1), item 3: unsupported kind "Deployment" (apiVersion "apps/v1")`},
			},
		},
		{
			name: "typed list with items that do not repeat their kind",
			in:   `{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"x"}},{"metadata":{"name":"y"}}]}`,
			want: want{objects: []string{"Pod default/x", "Pod default/y"}},
		},
		{
			name: "node filter",
			in: `apiVersion: v1
kind: Pod
metadata: {name: mine}
spec: {nodeName: node-a}
---
apiVersion: v1
kind: Pod
metadata: {name: theirs}
spec: {nodeName: node-b}
---
apiVersion: v1
kind: Pod
metadata: {name: anyone}
`,
			want: want{objects: []string{"Pod default/mine", "Pod default/anyone"}, ignored: 1},
		},
		{
			name: "unsupported kind",
			in: podYAML + `---
apiVersion: v1
kind: Service
metadata: {name: svc}
---
apiVersion: storage.k8s.io/v1beta1
kind: CSIDriver
metadata: {name: old}
`,
			want: want{
				objects: []string{"Pod default/web"},
				warnings: []string{
					`document 2 (line 15): unsupported kind "Service" (apiVersion "v1")`,
					`document 3 (line 19): unsupported kind "CSIDriver" (apiVersion "storage.k8s.io/v1beta1")`,
				},
			},
		},
		{
			name: "unknown field",
			in:   strings.Replace(podYAML, "  volumes:", "  volumez:", 1),
			want: want{objects: []string{"Pod default/web"}, warnings: []string{`unknown field "spec.volumez"`}},
		},
		{
			name: "duplicate key",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nmetadata: {name: a}\n",
			want: want{objects: []string{"Pod default/a"}, warnings: []string{`document 1 (line 1)`}},
		},
		{
			name: "YAML syntax error",
			in:   podYAML + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: [\n",
			want: want{fatal: "document 2 (line 15): invalid YAML: line 18: "},
		},
		{
			name: "pod without name",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\n",
			want: want{fatal: "document 1 (line 1): Pod: metadata.name is required"},
		},
		{
			name: "missing kind",
			in:   "apiVersion: v1\nmetadata: {name: x}\n",
			want: want{fatal: "document 1 (line 1): apiVersion and kind must be set"},
		},
		{
			name: "kind of the wrong type",
			in:   `{"apiVersion": "v1", "kind": 3}`,
			want: want{fatal: "document 1 (line 1): cannot decode object"},
		},
		{
			name: "not an object",
			in:   "- a\n- b\n",
			want: want{fatal: "document 1 (line 1): not an object"},
		},
		{
			name: "field of the wrong type",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {volumes: 3}\n",
			want: want{fatal: "document 1 (line 1): cannot decode Pod"},
		},
		{
			name: "invalid name",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: ../etc}\n",
			want: want{fatal: `metadata.name "../etc"`},
		},
		{
			name: "invalid volume name",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {volumes: [{name: ../../x, emptyDir: {}}]}\n",
			want: want{fatal: `spec.volumes[0].name "../../x"`},
		},
		{
			name: "duplicate volume name",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {volumes: [{name: a, emptyDir: {}}, {name: a, emptyDir: {}}]}\n",
			want: want{fatal: `duplicate volume name`},
		},
		{
			name: "volume without source",
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {volumes: [{name: a}]}\n",
			want: want{fatal: `exactly one volume source, found 0`},
		},
		{
			name: "storage class without provisioner",
			in:   "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: x}\n",
			want: want{fatal: `provisioner is required`},
		},
		{
			name: "empty file",
			in:   "\n  \n",
			want: want{fatal: "file is empty"},
		},
		{
			name: "only comments",
			in:   "# nothing here yet\n---\n",
			want: want{},
		},
		{
			name: "CRLF and byte order mark",
			in:   "\xef\xbb\xbf" + strings.ReplaceAll(podYAML+"---\n"+podYAML, "\n", "\r\n"),
			want: want{objects: []string{"Pod default/web", "Pod default/web"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := parser{nodeName: "node-a"}
			got := p.parse([]byte(tt.in))
			if tt.want.fatal != "" {
				if !strings.Contains(got.fatal, tt.want.fatal) {
					t.Fatalf("fatal = %q, want it to contain %q", got.fatal, tt.want.fatal)
				}
				return
			}
			if got.fatal != "" {
				t.Fatalf("unexpected fatal error %q", got.fatal)
			}
			var names []string
			for _, o := range got.objects {
				names = append(names, o.kind.String()+" "+displayName(o.ns, o.name))
			}
			if strings.Join(names, ",") != strings.Join(tt.want.objects, ",") {
				t.Errorf("objects = %q, want %q", names, tt.want.objects)
			}
			if len(got.warnings) != len(tt.want.warnings) {
				t.Fatalf("warnings = %q, want %d matching %q", got.warnings, len(tt.want.warnings), tt.want.warnings)
			}
			for i, w := range tt.want.warnings {
				if !strings.Contains(got.warnings[i], w) {
					t.Errorf("warning %d = %q, want it to contain %q", i, got.warnings[i], w)
				}
			}
			if len(got.ignored) != tt.want.ignored {
				t.Errorf("ignored = %q, want %d", got.ignored, tt.want.ignored)
			}
		})
	}
}

func TestUIDs(t *testing.T) {
	long := strings.Repeat("a", maxUIDLen+1)
	tests := []struct {
		uid   string
		valid bool
	}{
		{"0b4b1b8e-1d0f-4a5e-9c1e-3f2d1c0b9a88", true},
		{"my-pod_1.v2", true},
		{"..", false},
		{".", false},
		{"../../etc", false},
		{"a/b", false},
		{"a\x00b", false},
		{long, false},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.uid, "/", "_"), func(t *testing.T) {
			p := parser{}
			in := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","uid":` + quote(tt.uid) + `}}`
			got := p.parse([]byte(in))
			if tt.valid {
				if got.fatal != "" || len(got.objects) != 1 || string(got.objects[0].obj.(*corev1.Pod).UID) != tt.uid {
					t.Fatalf("uid %q rejected: %q", tt.uid, got.fatal)
				}
				return
			}
			if !strings.Contains(got.fatal, "metadata.uid") {
				t.Fatalf("uid %q: fatal = %q, want a metadata.uid error", tt.uid, got.fatal)
			}
		})
	}
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r < 0x20 {
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

func TestDerivedUID(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a := derivedUID(kindPod, "default", "web")
	if !uuid.MatchString(string(a)) {
		t.Errorf("%q is not a version 5 UUID", a)
	}
	if b := derivedUID(kindPod, "default", "web"); a != b {
		t.Errorf("derived UIDs differ: %q, %q", a, b)
	}
	// Pinned: a different UID for the same pod would orphan its directory.
	if a != "adddbc0f-ff91-50c5-bfb6-09ce5d04eee1" {
		t.Errorf("derived UID changed: %q", a)
	}
	if c := derivedUID(kindCSIDriver, "", "CSI.Example.COM"); c != "e9bdbcee-6df4-5370-a43e-3f432fb17c4d" {
		t.Errorf("derived UID changed: %q", c)
	}
	for _, other := range []string{
		string(derivedUID(kindPod, "other", "web")),
		string(derivedUID(kindPod, "default", "web2")),
		string(derivedUID(kindPVC, "default", "web")),
		string(derivedUID(kindPod, "default/web", "")),
	} {
		if other == string(a) {
			t.Errorf("UID %q derived for different objects", a)
		}
	}
}

func TestDefaults(t *testing.T) {
	in := `apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  volumes:
  - {name: s, secret: {secretName: s}}
  - {name: h, hostPath: {path: /tmp}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: c}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: v, namespace: ignored}
spec: {claimRef: {name: c}}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: d}
spec: {attachRequired: false}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: sc}
provisioner: d
`
	p := parser{}
	got := p.parse([]byte(in))
	if got.fatal != "" || len(got.objects) != 5 {
		t.Fatalf("parse: %q, %d objects", got.fatal, len(got.objects))
	}
	pod := got.objects[0].obj.(*corev1.Pod)
	if pod.Namespace != "default" || pod.UID != derivedUID(kindPod, "default", "p") {
		t.Errorf("pod namespace %q uid %q", pod.Namespace, pod.UID)
	}
	if m := pod.Spec.Volumes[0].Secret.DefaultMode; m == nil || *m != 0o644 {
		t.Errorf("secret defaultMode = %v", m)
	}
	if ty := pod.Spec.Volumes[1].HostPath.Type; ty == nil || *ty != corev1.HostPathUnset {
		t.Errorf("hostPath type = %v", ty)
	}
	if pod.Spec.SecurityContext == nil || pod.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		t.Errorf("pod spec not defaulted: %+v", pod.Spec)
	}
	pvc := got.objects[1].obj.(*corev1.PersistentVolumeClaim)
	if pvc.Spec.VolumeMode == nil || *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem || pvc.UID == "" {
		t.Errorf("pvc not defaulted: %+v", pvc)
	}
	pv := got.objects[2].obj.(*corev1.PersistentVolume)
	if pv.Namespace != "" || pv.Spec.ClaimRef.Namespace != "default" || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("pv not defaulted: %+v", pv)
	}
	d := got.objects[3].obj.(*storagev1.CSIDriver)
	if *d.Spec.AttachRequired || *d.Spec.PodInfoOnMount || *d.Spec.FSGroupPolicy != storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy {
		t.Errorf("csidriver not defaulted: %+v", d.Spec)
	}
	sc := got.objects[4].obj.(*storagev1.StorageClass)
	if *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete || *sc.VolumeBindingMode != storagev1.VolumeBindingImmediate {
		t.Errorf("storage class not defaulted: %+v", sc)
	}
}

func TestSplitYAML(t *testing.T) {
	in := "a: 1\n---\nb: 2\n--- {c: 3}\n----\n---x\n"
	var docs []string
	var lines []int
	err := splitYAML([]byte(in), func(doc []byte, line int) error {
		docs = append(docs, string(doc))
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a: 1\n", "\nb: 2\n", " {c: 3}\n----\n---x\n"}
	if strings.Join(docs, "|") != strings.Join(want, "|") {
		t.Errorf("docs = %q, want %q", docs, want)
	}
	if len(lines) != 3 || lines[0] != 1 || lines[1] != 2 || lines[2] != 4 {
		t.Errorf("lines = %v", lines)
	}
}

// TestPodSpecDefaults: securityContext and terminationGracePeriodSeconds
// are defaulted whichever of them a pod sets, a set one is kept, and no
// two pods share what was filled in.
func TestPodSpecDefaults(t *testing.T) {
	grace := int64(5)
	sc := &corev1.PodSecurityContext{FSGroup: &grace}
	tests := []struct {
		name      string
		sc        *corev1.PodSecurityContext
		grace     *int64
		wantSC    *corev1.PodSecurityContext
		wantGrace int64
	}{
		{"neither", nil, nil, &corev1.PodSecurityContext{}, 30},
		{"securityContext set", sc, nil, sc, 30},
		{"grace period set", nil, &grace, &corev1.PodSecurityContext{}, 5},
		{"both set", sc, &grace, sc, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var specs [2]corev1.PodSpec
			for i := range specs {
				specs[i] = corev1.PodSpec{SecurityContext: tt.sc, TerminationGracePeriodSeconds: tt.grace}
				if err := preparePodSpec(&specs[i]); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(specs[i].SecurityContext, tt.wantSC) || specs[i].TerminationGracePeriodSeconds == nil || *specs[i].TerminationGracePeriodSeconds != tt.wantGrace {
					t.Fatalf("securityContext %+v, grace period %v", specs[i].SecurityContext, specs[i].TerminationGracePeriodSeconds)
				}
			}
			if tt.sc == nil && specs[0].SecurityContext == specs[1].SecurityContext {
				t.Fatal("two pods share a defaulted securityContext")
			}
			if tt.grace == nil && specs[0].TerminationGracePeriodSeconds == specs[1].TerminationGracePeriodSeconds {
				t.Fatal("two pods share a defaulted grace period")
			}
		})
	}
}
