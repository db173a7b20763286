package manifest

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/randfill"
)

// checkV2 is the oracle of fastDecode's first step: whatever v2 accepts
// (with strictV2), the strict decoder accepts without a strict error and
// reads into the same object. It reports whether v2 accepted.
func checkV2(t *testing.T, gvk schema.GroupVersionKind, js []byte) bool {
	t.Helper()
	fast, err := scheme.New(gvk)
	if err != nil {
		t.Fatal(err)
	}
	if jsonv2.Unmarshal(js, fast, strictV2) != nil {
		return false
	}
	strict, _ := scheme.New(gvk)
	strictErrs, err := kjson.UnmarshalStrict(js, strict)
	if err != nil || len(strictErrs) > 0 {
		t.Fatalf("%s: v2 accepted what the strict decoder does not (%v, %v): %s", gvk.Kind, err, strictErrs, js)
	}
	if !reflect.DeepEqual(fast, strict) {
		t.Fatalf("%s: v2 and the strict decoder differ on %s:\nv2     %#v\nstrict %#v", gvk.Kind, js, fast, strict)
	}
	return true
}

var (
	gvkPod   = corev1.SchemeGroupVersion.WithKind("Pod")
	gvkCM    = corev1.SchemeGroupVersion.WithKind("ConfigMap")
	gvkSec   = corev1.SchemeGroupVersion.WithKind("Secret")
	gvkPV    = corev1.SchemeGroupVersion.WithKind("PersistentVolume")
	gvkPVC   = corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim")
	gvkSC    = storagev1.SchemeGroupVersion.WithKind("StorageClass")
	gvkCSI   = storagev1.SchemeGroupVersion.WithKind("CSIDriver")
	v2Kinds  = []schema.GroupVersionKind{gvkPod, gvkCM, gvkSec, gvkPV, gvkPVC, gvkSC, gvkCSI}
	v2Prefix = map[schema.GroupVersionKind]string{}
)

func init() {
	for _, gvk := range v2Kinds {
		v2Prefix[gvk] = fmt.Sprintf(`{"apiVersion":%q,"kind":%q,`, gvk.GroupVersion(), gvk.Kind)
	}
}

// fastDecodeV2Cases are where v2 and v1 could part: each either reads
// alike (take true) or v2 refuses it (take false).
var fastDecodeV2Cases = []struct {
	name string
	gvk  schema.GroupVersionKind
	rest string // after apiVersion and kind
	take bool
}{
	{"pod", gvkPod, `"metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}],"volumes":[{"name":"v","emptyDir":{"medium":"Memory","sizeLimit":"64Mi"}}]}}`, true},
	{"field name in other case", gvkPod, `"metadata":{"Name":"p"}}`, false},
	{"kind in other case", gvkPod, `"metadata":{"name":"p"},"Kind":"Pod"}`, false},
	{"inline field in other case", gvkPod, `"spec":{"volumes":[{"name":"v","EmptyDir":{}}]}}`, false},
	{"duplicate field", gvkPod, `"metadata":{"name":"p","name":"q"}}`, false},
	{"duplicate map key", gvkCM, `"metadata":{"name":"c"},"data":{"a":"1","a":"2"}}`, false},
	{"duplicate through inline", gvkPod, `"spec":{"volumes":[{"name":"v","name":"w","emptyDir":{}}]}}`, false},
	{"unknown field", gvkPod, `"metadata":{"name":"p"},"spec":{"volumez":[]}}`, false},
	{"unknown field in inline struct", gvkPod, `"spec":{"volumes":[{"name":"v","emptyDir":{},"medium":"Memory"}]}}`, false},
	{"escaped name", gvkPod, `"metadata":{"na\u006de":"p"}}`, true},
	{"null struct", gvkPod, `"metadata":null,"spec":null}`, true},
	{"null slice and map", gvkPod, `"metadata":{"labels":null},"spec":{"volumes":null}}`, true},
	{"null slice element", gvkPod, `"spec":{"containers":[null,{"name":"c"}]}}`, true},
	{"null string", gvkPod, `"metadata":{"name":null}}`, true},
	{"null pointer", gvkPod, `"spec":{"terminationGracePeriodSeconds":null}}`, true},
	{"null time", gvkPod, `"metadata":{"creationTimestamp":null,"deletionTimestamp":null}}`, true},
	{"null quantity", gvkPod, `"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":null}}}],"volumes":[{"name":"v","emptyDir":{"sizeLimit":null}}]}}`, true},
	{"null map value", gvkCM, `"data":{"a":null},"binaryData":{"b":null}}`, true},
	{"null port", gvkPod, `"spec":{"containers":[{"name":"c","livenessProbe":{"httpGet":{"port":null}}}]}}`, true},
	{"empty collections", gvkPod, `"metadata":{"labels":{}},"spec":{"volumes":[],"containers":[{"name":"c","args":[]}]}}`, true},
	{"fraction into int", gvkPod, `"spec":{"terminationGracePeriodSeconds":1.0}}`, false},
	{"exponent into int", gvkPod, `"spec":{"terminationGracePeriodSeconds":1e3}}`, false},
	{"minus zero into int", gvkPod, `"spec":{"terminationGracePeriodSeconds":-0}}`, true},
	{"int32 overflow", gvkPod, `"spec":{"containers":[{"name":"c","ports":[{"containerPort":3000000000}]}]}}`, false},
	{"string into int", gvkPod, `"spec":{"terminationGracePeriodSeconds":"30"}}`, false},
	{"number into string", gvkPod, `"metadata":{"name":1}}`, false},
	{"quantities", gvkPod, `"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"500m","memory":1e9},"requests":{"cpu":0.5,"memory":"1.5Gi"}}}]}}`, true},
	{"bad quantity", gvkPod, `"spec":{"volumes":[{"name":"v","emptyDir":{"sizeLimit":"lots"}}]}}`, false},
	{"time", gvkPod, `"metadata":{"creationTimestamp":"2024-05-01T10:00:00Z","deletionTimestamp":"2024-05-01T12:00:00+02:00"}}`, true},
	{"bad time", gvkPod, `"metadata":{"creationTimestamp":"yesterday"}}`, false},
	{"int or string", gvkPod, `"spec":{"containers":[{"name":"c","livenessProbe":{"httpGet":{"port":8080}},"readinessProbe":{"tcpSocket":{"port":"http"}}}]}}`, true},
	{"inline structs", gvkPod, `"spec":{"volumes":[{"name":"v","configMap":{"name":"c","defaultMode":420}}],"containers":[{"name":"c","env":[{"name":"e","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}],"livenessProbe":{"exec":{"command":["true"]},"periodSeconds":3}}]}}`, true},
	{"managed fields", gvkPod, `"metadata":{"managedFields":[{"manager":"m","fieldsType":"FieldsV1","fieldsV1":{ "f:spec" : {"f:x": {}} }}]}}`, true},
	{"binary data", gvkCM, `"binaryData":{"a":"aGVsbG8=","b":""}}`, true},
	{"binary data with line break", gvkCM, `"binaryData":{"a":"aGVs\nbG8="}}`, false},
	{"binary data without padding", gvkCM, `"binaryData":{"a":"aGVsbG8"}}`, false},
	{"binary data not base64", gvkSec, `"data":{"a":"!!!"}}`, false},
	{"secret", gvkSec, `"metadata":{"name":"s"},"type":"Opaque","data":{"a":"aGVsbG8="},"stringData":{"b":"c"},"immutable":true}`, true},
	{"invalid UTF-8", gvkCM, "\"data\":{\"a\":\"\xff\"}}", false},
	{"lone surrogate", gvkCM, `"data":{"a":"\ud800"}}`, false},
	{"escapes", gvkCM, `"data":{"a":"\u00e9\n\"\\\/\ud83d\ude00"}}`, true},
	{"trailing data", gvkCM, `"data":{}} {}`, false},
	{"trailing space", gvkCM, "\"data\":{}}\n\t ", true},
	{"persistent volume", gvkPV, `"metadata":{"name":"pv"},"spec":{"capacity":{"storage":"1Gi"},"hostPath":{"path":"/x","type":""},"claimRef":{"name":"c"},"accessModes":["ReadWriteOnce"]}}`, true},
	{"claim", gvkPVC, `"metadata":{"name":"c"},"spec":{"resources":{"requests":{"storage":"1Gi"}},"volumeMode":"Block","dataSourceRef":{"kind":"k","name":"n"}}}`, true},
	{"storage class", gvkSC, `"metadata":{"name":"s"},"provisioner":"p","parameters":{"a":"b"},"allowVolumeExpansion":true,"allowedTopologies":[{"matchLabelExpressions":[{"key":"k","values":["v"]}]}]}`, true},
	{"csi driver", gvkCSI, `"metadata":{"name":"d"},"spec":{"attachRequired":false,"tokenRequests":[{"audience":"a","expirationSeconds":600}],"volumeLifecycleModes":["Ephemeral"]}}`, true},
	{"bool from string", gvkCSI, `"spec":{"attachRequired":"false"}}`, false},
}

func TestFastDecodeV2(t *testing.T) {
	for _, c := range fastDecodeV2Cases {
		t.Run(c.name, func(t *testing.T) {
			if got := checkV2(t, c.gvk, []byte(v2Prefix[c.gvk]+c.rest)); got != c.take {
				t.Errorf("v2 accepted = %v, want %v", got, c.take)
			}
		})
	}
}

// TestFastDecodeV2RandomObjects checks the oracle on random objects of every
// kind, as encoding/json writes them: every field of every type is met.
func TestFastDecodeV2RandomObjects(t *testing.T) {
	f := randfill.NewWithSeed(1).NilChance(0.3).NumElements(0, 2).MaxDepth(12).Funcs(
		func(q *resource.Quantity, c randfill.Continue) {
			*q = *resource.NewMilliQuantity(c.Int63n(1<<40), resource.DecimalSI)
		},
		func(fv *metav1.FieldsV1, c randfill.Continue) {
			fv.SetRawBytes(fmt.Appendf(nil, `{"f:%d":{}}`, c.Intn(9)))
		},
		func(v *intstr.IntOrString, c randfill.Continue) {
			if c.Bool() {
				*v = intstr.FromInt32(c.Int31())
			} else {
				*v = intstr.FromString(c.String(8))
			}
		},
	)
	for _, gvk := range v2Kinds {
		accepted := 0
		for range 100 {
			obj, _ := scheme.New(gvk)
			f.Fill(obj)
			js, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			if checkV2(t, gvk, js) {
				accepted++
			}
		}
		if accepted < 90 {
			t.Errorf("%s: v2 accepted only %d of 100 random objects", gvk.Kind, accepted)
		}
	}
}

// FuzzFastDecodeV2 runs the oracle on any input, as any supported kind.
func FuzzFastDecodeV2(f *testing.F) {
	for _, c := range fastDecodeV2Cases {
		f.Add(uint8(slices.Index(v2Kinds, c.gvk)), []byte(v2Prefix[c.gvk]+c.rest))
	}
	f.Fuzz(func(t *testing.T, k uint8, js []byte) {
		checkV2(t, v2Kinds[int(k)%len(v2Kinds)], js)
	})
}

// TestFastDecodeTypes pins what of the supported kinds' types v2 could read
// otherwise than v1, each covered by fastDecodeV2Cases: the types that
// unmarshal themselves, []byte, inlined and embedded structs. A new
// Kubernetes version that adds another (an interface, a float, an array, a
// time.Duration, a field v2 would inline and v1 not) fails here, to be
// looked at and added to the cases.
func TestFastDecodeTypes(t *testing.T) {
	unmarshaler := reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler := reflect.TypeFor[encoding.TextUnmarshaler]()
	found := map[string]bool{}
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		if seen[ty] {
			return
		}
		seen[ty] = true
		if p := reflect.PointerTo(ty); p.Implements(unmarshaler) || p.Implements(textUnmarshaler) {
			_, from := p.MethodByName("UnmarshalJSONFrom")
			found[fmt.Sprintf("method %v json=%v text=%v from=%v", ty, p.Implements(unmarshaler), p.Implements(textUnmarshaler), from)] = true
			return
		}
		switch ty.Kind() {
		case reflect.Pointer:
			walk(ty.Elem())
		case reflect.Slice:
			if ty.Elem().Kind() == reflect.Uint8 {
				found["bytes "+ty.String()] = true
				return
			}
			walk(ty.Elem())
		case reflect.Map:
			if ty.Key().Kind() != reflect.String {
				found["map key "+ty.String()] = true
			}
			walk(ty.Elem())
		case reflect.String, reflect.Bool, reflect.Int32, reflect.Int64:
		case reflect.Struct:
			for i := range ty.NumField() {
				sf := ty.Field(i)
				tag := sf.Tag.Get("json")
				switch name, opts, _ := strings.Cut(tag, ","); {
				case !sf.IsExported():
					found[fmt.Sprintf("unexported %v.%s", ty, sf.Name)] = true
				case sf.Anonymous && name == "":
					found[fmt.Sprintf("inline %v in %v, tag %q", sf.Type, ty, tag)] = true
				case sf.Anonymous:
					found[fmt.Sprintf("embedded %v as %q", sf.Type, name)] = true
				case strings.Contains(opts, "inline") || strings.Contains(opts, "string") || name == "-":
					found[fmt.Sprintf("field %v.%s, tag %q", ty, sf.Name, tag)] = true
				}
				walk(sf.Type)
			}
		default:
			found[fmt.Sprintf("kind %v of %v", ty.Kind(), ty)] = true
		}
	}
	for _, gvk := range v2Kinds {
		obj, _ := scheme.New(gvk)
		walk(reflect.TypeOf(obj).Elem())
	}
	var got []string
	for s := range found {
		got = append(got, s)
	}
	slices.Sort(got)
	want := []string{
		"bytes []uint8",
		"embedded v1.ObjectMeta as \"metadata\"",
		"inline v1.EphemeralContainerCommon in v1.EphemeralContainer, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.ConfigMapEnvSource, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.ConfigMapKeySelector, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.ConfigMapProjection, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.ConfigMapVolumeSource, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.SecretEnvSource, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.SecretKeySelector, tag \",inline\"",
		"inline v1.LocalObjectReference in v1.SecretProjection, tag \",inline\"",
		"inline v1.PersistentVolumeSource in v1.PersistentVolumeSpec, tag \",inline\"",
		"inline v1.ProbeHandler in v1.Probe, tag \",inline\"",
		"inline v1.TypeMeta in v1.CSIDriver, tag \",inline\"",
		"inline v1.TypeMeta in v1.ConfigMap, tag \",inline\"",
		"inline v1.TypeMeta in v1.PersistentVolume, tag \",inline\"",
		"inline v1.TypeMeta in v1.PersistentVolumeClaim, tag \",inline\"",
		"inline v1.TypeMeta in v1.Pod, tag \",inline\"",
		"inline v1.TypeMeta in v1.Secret, tag \",inline\"",
		"inline v1.TypeMeta in v1.StorageClass, tag \",inline\"",
		"inline v1.VolumeSource in v1.Volume, tag \",inline\"",
		"method intstr.IntOrString json=true text=false from=false",
		"method resource.Quantity json=true text=false from=false",
		"method v1.FieldsV1 json=true text=false from=false",
		"method v1.Time json=true text=true from=false",
	}
	if !slices.Equal(got, want) {
		t.Errorf("types v2 could read otherwise changed; check them against v1 and cover them in fastDecodeV2Cases:\ngot  %q\nwant %q", got, want)
	}
}
