package manifest

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// kind identifies the object kinds the Store serves.
type kind uint8

const (
	kindPod kind = iota
	kindPVC
	kindPV
	kindStorageClass
	kindCSIDriver
	kindConfigMap
	kindSecret
	numKinds
)

var kindNames = [numKinds]string{"Pod", "PersistentVolumeClaim", "PersistentVolume", "StorageClass", "CSIDriver", "ConfigMap", "Secret"}

func (k kind) String() string { return kindNames[k] }

var (
	// The scheme only knows core/v1 and storage/v1: the full client-go scheme
	// would cost several MiB of RSS for types the agent never reads.
	scheme  = runtime.NewScheme()
	decoder runtime.Decoder

	supportedKinds = map[schema.GroupVersionKind]kind{
		corev1.SchemeGroupVersion.WithKind("Pod"):                   kindPod,
		corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"): kindPVC,
		corev1.SchemeGroupVersion.WithKind("PersistentVolume"):      kindPV,
		storagev1.SchemeGroupVersion.WithKind("StorageClass"):       kindStorageClass,
		storagev1.SchemeGroupVersion.WithKind("CSIDriver"):          kindCSIDriver,
		corev1.SchemeGroupVersion.WithKind("ConfigMap"):             kindConfigMap,
		corev1.SchemeGroupVersion.WithKind("Secret"):                kindSecret,
	}

	// listKinds maps list kinds to the kind their items have when they do not
	// say; the generic v1 List requires every item to say.
	listKinds = map[schema.GroupVersionKind]schema.GroupVersionKind{
		corev1.SchemeGroupVersion.WithKind("List"):                      {},
		corev1.SchemeGroupVersion.WithKind("PodList"):                   corev1.SchemeGroupVersion.WithKind("Pod"),
		corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaimList"): corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"),
		corev1.SchemeGroupVersion.WithKind("PersistentVolumeList"):      corev1.SchemeGroupVersion.WithKind("PersistentVolume"),
		storagev1.SchemeGroupVersion.WithKind("StorageClassList"):       storagev1.SchemeGroupVersion.WithKind("StorageClass"),
		storagev1.SchemeGroupVersion.WithKind("CSIDriverList"):          storagev1.SchemeGroupVersion.WithKind("CSIDriver"),
		corev1.SchemeGroupVersion.WithKind("ConfigMapList"):             corev1.SchemeGroupVersion.WithKind("ConfigMap"),
		corev1.SchemeGroupVersion.WithKind("SecretList"):                corev1.SchemeGroupVersion.WithKind("Secret"),
	}
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(storagev1.AddToScheme(scheme))
	// Strict, so that a misspelt field (say "volumeMount" for
	// "volumeMounts") is reported instead of silently dropping part of a pod.
	decoder = jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme,
		jsonserializer.SerializerOptions{Strict: true})
}

// object is one decoded, validated and defaulted object of a file. Its obj is
// never modified once the object is built, so it can be published as is.
type object struct {
	kind kind
	ns   string // empty for cluster-scoped kinds
	name string
	loc  location
	obj  any
}

func (o *object) key() objKey { return objKey{ns: o.ns, name: o.name} }

// location says where in a file an object or problem is, for messages.
type location struct {
	doc  int // 1-based, counting documents that are not empty
	line int // 1-based line the document starts on
	item int // 1-based index in a list, 0 when not in a list
}

func (l location) String() string {
	s := fmt.Sprintf("document %d (line %d)", l.doc, l.line)
	if l.item > 0 {
		s += fmt.Sprintf(", item %d", l.item)
	}
	return s
}

// parsed is the outcome of parsing one file.
type parsed struct {
	objects []object
	// warnings are problems that do not stop the rest of the file from
	// being used (unsupported kinds, unknown fields).
	warnings []string
	// ignored names pods that belong to other nodes.
	ignored []string
	// fatal is set when the file cannot be used; the objects are then
	// meaningless and the last good version stays in effect.
	fatal string
}

type parser struct {
	nodeName string
	// decoderOnly turns fastDecode and fastYAMLToJSON off, for tests
	// comparing the two paths.
	decoderOnly bool
	// jsonOnly turns decodePodTree off, for tests comparing it with
	// fastDecode.
	jsonOnly bool
}

// parse decodes a file holding YAML documents or a JSON stream.
func (p *parser) parse(data []byte) parsed {
	var res parsed
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	if len(bytes.TrimSpace(data)) == 0 {
		// Writers that truncate and then write (shell redirection) expose an
		// empty file for a moment; taking it at its word would delete every
		// pod the file had.
		res.fatal = "file is empty; remove the file to delete its objects"
		return res
	}
	var err error
	if isJSON(data) {
		var fallback bool
		fallback, err = p.parseJSON(data, &res)
		if fallback {
			res = parsed{}
			err = p.parseYAML(data, &res)
		}
	} else {
		err = p.parseYAML(data, &res)
	}
	if err != nil {
		res.objects, res.warnings, res.ignored = nil, nil, nil
		res.fatal = err.Error()
	}
	return res
}

func isJSON(data []byte) bool {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] == '{'
}

// parseJSON reads a stream of JSON objects. fallback reports that the first
// value is not JSON, so the file must be YAML starting with a flow mapping.
func (p *parser) parseJSON(data []byte, res *parsed) (fallback bool, err error) {
	// Most files are one object: decoded whole, without splitting first.
	if obj, gvk, ok := p.fastDecode(data, sliceHint{}); ok {
		return false, p.add(obj, gvk, location{doc: 1, line: lineAt(data, 0)}, res, true)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for doc := 1; ; doc++ {
		start := dec.InputOffset()
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return false, nil
			}
			if doc == 1 {
				return true, nil
			}
			return false, fmt.Errorf("document %d: invalid JSON: %v", doc, err)
		}
		loc := location{doc: doc, line: lineAt(data, start)}
		if err := p.decodeDocument(raw, sliceHint{}, loc, res, true); err != nil {
			return false, err
		}
	}
}

// lineAt returns the line of the first non-space byte at or after off.
func lineAt(data []byte, off int64) int {
	for off < int64(len(data)) && isSpace(data[off]) {
		off++
	}
	return bytes.Count(data[:off], []byte("\n")) + 1
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// jsonBuffers hold the JSON of YAML documents between conversion and
// decoding, which copies what it keeps: a pod's JSON is garbage at once.
var jsonBuffers = sync.Pool{New: func() any { return new([]byte) }}

// maxKeptJSON keeps a huge document's buffer out of the pool.
const maxKeptJSON = 64 << 10

func (p *parser) parseYAML(data []byte, res *parsed) error {
	doc := 0
	buf := jsonBuffers.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= maxKeptJSON {
			jsonBuffers.Put(buf)
		}
	}()
	return splitYAML(data, func(text []byte, line int) error {
		js, ok, hint := []byte(nil), false, sliceHint{}
		if !p.decoderOnly {
			var pod *corev1.Pod
			if js, pod, hint, ok = fastYAMLToPod((*buf)[:0], text, !p.jsonOnly); pod != nil {
				doc++
				return p.add(pod, podGVK, location{doc: doc, line: line}, res, true)
			} else if ok {
				*buf = js
			}
		}
		var err error
		if !ok {
			js, err = yaml.YAMLToJSONStrict(text)
		}
		if err != nil {
			// The strict conversion also fails on duplicate keys, which only
			// deserve a warning; the lenient one tells them from real syntax
			// errors.
			var lerr error
			if js, lerr = yaml.YAMLToJSON(text); lerr != nil {
				return fmt.Errorf("document %d (line %d): invalid YAML: %s", doc+1, line, yamlError(lerr, line))
			}
			res.warnings = append(res.warnings, fmt.Sprintf("document %d (line %d): %s", doc+1, line, yamlError(err, line)))
		}
		if bytes.Equal(js, []byte("null")) {
			// Empty, comment-only or "---"-terminated document.
			return nil
		}
		doc++
		return p.decodeDocument(js, hint, location{doc: doc, line: line}, res, true)
	})
}

var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// yamlError rewrites the line numbers of a YAML error, which count from the
// start of the document, to count from the start of the file.
func yamlError(err error, docLine int) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	msg = strings.TrimPrefix(msg, "yaml: ")
	return yamlLine.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(m[len("line "):])
		if err != nil {
			return m
		}
		return "line " + strconv.Itoa(n+docLine-1)
	})
}

// splitYAML calls fn for every document of a YAML stream with the line the
// document starts on. A separator is "---" at the start of a line followed by
// the end of the line or blanks; what follows the blanks belongs to the next
// document, as YAML allows ("--- {kind: Pod, ...}").
func splitYAML(data []byte, fn func(doc []byte, line int) error) error {
	start, startLine, line := 0, 1, 1
	for off := 0; off < len(data); line++ {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
		}
		l := data[off:next]
		if len(l) >= 3 && l[0] == '-' && l[1] == '-' && l[2] == '-' && (len(l) == 3 || isSpace(l[3])) {
			if off > start {
				if err := fn(data[start:off], startLine); err != nil {
					return err
				}
			}
			start, startLine = off+3, line
		}
		off = next
	}
	if start < len(data) {
		return fn(data[start:], startLine)
	}
	return nil
}

// decodeDocument decodes one JSON document, or an item of a v1 List (top
// false), and adds what it holds to res. Errors returned are fatal for the
// file. hint is what the YAML said about the document's slices, if it was
// YAML.
func (p *parser) decodeDocument(js []byte, hint sliceHint, loc location, res *parsed, top bool) error {
	if t := bytes.TrimLeft(js, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return fmt.Errorf("%s: not an object", loc)
	}
	if obj, gvk, ok := p.fastDecode(js, hint); ok {
		return p.add(obj, gvk, loc, res, top)
	}
	obj, gvk, err := decoder.Decode(js, nil, nil)
	if gvk == nil { // apiVersion or kind of the wrong type
		gvk = &schema.GroupVersionKind{Kind: "object"}
	}
	switch {
	case err == nil:
	case runtime.IsMissingKind(err) || runtime.IsMissingVersion(err):
		return fmt.Errorf("%s: apiVersion and kind must be set", loc)
	case runtime.IsNotRegisteredError(err):
		res.warnings = append(res.warnings, unsupported(loc, gvk))
		return nil
	case runtime.IsStrictDecodingError(err) && obj != nil:
		// Unknown or duplicate fields: worth a warning, but a field added
		// by a newer Kubernetes must not make the whole file unusable.
		res.warnings = append(res.warnings, fmt.Sprintf("%s: %s %v", loc, gvk.Kind, err))
	default:
		return fmt.Errorf("%s: cannot decode %s: %v", loc, gvk.Kind, err)
	}
	return p.add(obj, *gvk, loc, res, top)
}

func unsupported(loc location, gvk *schema.GroupVersionKind) string {
	return fmt.Sprintf("%s: unsupported kind %q (apiVersion %q); ignored", loc, gvk.Kind, gvk.GroupVersion().String())
}

// add adds a decoded object, or the items of a decoded list, to res.
func (p *parser) add(obj runtime.Object, gvk schema.GroupVersionKind, loc location, res *parsed, top bool) error {
	if k, ok := supportedKinds[gvk]; ok {
		return p.addObject(k, obj, loc, res)
	}
	itemGVK, isList := listKinds[gvk]
	switch {
	case isList && !top:
		res.warnings = append(res.warnings, fmt.Sprintf("%s: lists inside lists are not supported; ignored", loc))
		return nil
	case !isList:
		res.warnings = append(res.warnings, unsupported(loc, &gvk))
		return nil
	}
	if list, ok := obj.(*corev1.List); ok {
		for i := range list.Items {
			iloc := loc
			iloc.item = i + 1
			if err := p.decodeDocument(list.Items[i].Raw, sliceHint{}, iloc, res, false); err != nil {
				return err
			}
		}
		return nil
	}
	// A typed list: its items are decoded already and carry no kind.
	items, err := meta.ExtractList(obj)
	if err != nil {
		return fmt.Errorf("%s: %v", loc, err)
	}
	for i, item := range items {
		iloc := loc
		iloc.item = i + 1
		if err := p.add(item, itemGVK, iloc, res, false); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) addObject(k kind, obj runtime.Object, loc location, res *parsed) error {
	o := object{kind: k, loc: loc, obj: obj}
	if err := p.prepare(&o); err != nil {
		return fmt.Errorf("%s: %s: %v", loc, k, err)
	}
	if k == kindPod {
		pod := o.obj.(*corev1.Pod)
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != p.nodeName {
			res.ignored = append(res.ignored, o.ns+"/"+o.name)
			return nil
		}
	}
	res.objects = append(res.objects, o)
	return nil
}

// prepare validates what the agent relies on and fills in what the API
// server would have, so the populator sees the same objects in both modes.
func (p *parser) prepare(o *object) error {
	var err error
	switch obj := o.obj.(type) {
	case *corev1.Pod:
		if err = prepareMeta(&obj.ObjectMeta, kindPod, true, isDNS1123Subdomain); err == nil {
			err = preparePodSpec(&obj.Spec)
		}
		o.ns, o.name = obj.Namespace, obj.Name
	case *corev1.PersistentVolumeClaim:
		err = prepareMeta(&obj.ObjectMeta, kindPVC, true, isDNS1123Subdomain)
		if obj.Spec.VolumeMode == nil {
			obj.Spec.VolumeMode = ptr(corev1.PersistentVolumeFilesystem)
		}
		o.ns, o.name = obj.Namespace, obj.Name
	case *corev1.PersistentVolume:
		err = prepareMeta(&obj.ObjectMeta, kindPV, false, isDNS1123Subdomain)
		if obj.Spec.VolumeMode == nil {
			obj.Spec.VolumeMode = ptr(corev1.PersistentVolumeFilesystem)
		}
		if obj.Spec.PersistentVolumeReclaimPolicy == "" {
			obj.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		}
		if obj.Spec.HostPath != nil && obj.Spec.HostPath.Type == nil {
			obj.Spec.HostPath.Type = ptr(corev1.HostPathUnset)
		}
		// Hand-written claimRefs often leave the namespace out; here it can
		// only mean what an empty namespace means for the claim itself.
		if ref := obj.Spec.ClaimRef; ref != nil && ref.Namespace == "" {
			ref.Namespace = corev1.NamespaceDefault
		}
		o.name = obj.Name
	case *storagev1.StorageClass:
		err = prepareMeta(&obj.ObjectMeta, kindStorageClass, false, isDNS1123Subdomain)
		if err == nil && obj.Provisioner == "" {
			err = errors.New("provisioner is required")
		}
		if obj.ReclaimPolicy == nil {
			obj.ReclaimPolicy = ptr(corev1.PersistentVolumeReclaimDelete)
		}
		if obj.VolumeBindingMode == nil {
			obj.VolumeBindingMode = ptr(storagev1.VolumeBindingImmediate)
		}
		o.name = obj.Name
	case *storagev1.CSIDriver:
		err = prepareMeta(&obj.ObjectMeta, kindCSIDriver, false, isCSIDriverName)
		defaultCSIDriver(&obj.Spec)
		o.name = obj.Name
	case *corev1.ConfigMap:
		err = prepareMeta(&obj.ObjectMeta, kindConfigMap, true, isDNS1123Subdomain)
		if err == nil {
			err = checkKeys(obj.Data, obj.BinaryData)
		}
		o.ns, o.name = obj.Namespace, obj.Name
	case *corev1.Secret:
		err = prepareMeta(&obj.ObjectMeta, kindSecret, true, isDNS1123Subdomain)
		// As the API server does: stringData is merged into data.
		for k, v := range obj.StringData {
			if obj.Data == nil {
				obj.Data = map[string][]byte{}
			}
			obj.Data[k] = []byte(v)
		}
		obj.StringData = nil
		if obj.Type == "" {
			obj.Type = corev1.SecretTypeOpaque
		}
		if err == nil {
			err = checkKeys[[]byte](nil, obj.Data)
		}
		o.ns, o.name = obj.Namespace, obj.Name
	default:
		err = fmt.Errorf("unexpected type %T", o.obj)
	}
	return err
}

// checkKeys applies the API's rule for ConfigMap and Secret keys, which
// become file names: [-._a-zA-Z0-9]+, and no key in both maps.
func checkKeys[V any](data map[string]V, binary map[string][]byte) error {
	var errs []string
	for k := range data {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, fmt.Sprintf("key %q: %s", k, msg))
		}
		if _, dup := binary[k]; dup {
			errs = append(errs, fmt.Sprintf("key %q is in both data and binaryData", k))
		}
	}
	for k := range binary {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, fmt.Sprintf("key %q: %s", k, msg))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func prepareMeta(m *metav1.ObjectMeta, k kind, namespaced bool, validName func(string) []string) error {
	if m.Name == "" {
		return errors.New("metadata.name is required")
	}
	if msgs := validName(m.Name); len(msgs) > 0 {
		return fmt.Errorf("metadata.name %q: %s", m.Name, strings.Join(msgs, "; "))
	}
	if namespaced {
		if m.Namespace == "" {
			m.Namespace = corev1.NamespaceDefault
		}
		if msgs := isDNS1123Label(m.Namespace); len(msgs) > 0 {
			return fmt.Errorf("metadata.namespace %q: %s", m.Namespace, strings.Join(msgs, "; "))
		}
	} else {
		// As the API server does for cluster-scoped objects.
		m.Namespace = ""
	}
	if m.UID == "" {
		m.UID = derivedUID(k, m.Namespace, m.Name)
	} else if err := checkUID(m.UID); err != nil {
		return err
	}
	return nil
}

func isCSIDriverName(name string) []string {
	msgs := isDNS1123Subdomain(strings.ToLower(name))
	if len(name) > 63 {
		msgs = append(msgs, validation.MaxLenError(63))
	}
	return msgs
}

// maxUIDLen is far above the 36 bytes of a UUID but keeps a pod directory
// name well within NAME_MAX.
const maxUIDLen = 128

// checkUID makes sure a UID given in a manifest can name a pod directory:
// the agent builds paths from it and must not be led outside its root.
func checkUID(uid types.UID) error {
	s := string(uid)
	switch {
	case s == "." || s == "..":
		return fmt.Errorf("metadata.uid %q is not a valid path element", s)
	case len(s) > maxUIDLen:
		return fmt.Errorf("metadata.uid is longer than %d bytes", maxUIDLen)
	case strings.ContainsAny(s, "/\x00"):
		return fmt.Errorf("metadata.uid %q must not contain '/' or NUL", s)
	}
	return nil
}

// uidNamespace is the name space of derived UIDs (RFC 9562 section 5.5); any
// fixed value works, changing it would change every derived UID.
var uidNamespace = [16]byte{0x6c, 0x1b, 0x9e, 0x2a, 0x43, 0x5d, 0x4f, 0x0e, 0x8a, 0x77, 0x21, 0xc4, 0x3b, 0x90, 0x5f, 0xd2}

// derivedUID returns a version 5 UUID of kind/namespace/name, so a restart,
// or another agent reading the same files, finds the same pod directories.
func derivedUID(k kind, namespace, name string) types.UID {
	// Hashed from a buffer on the stack: names are validated, so short.
	var inBuf [len(uidNamespace) + 2*validation.DNS1123SubdomainMaxLength + 32]byte
	in := append(inBuf[:0], uidNamespace[:]...)
	in = append(append(in, k.String()...), '/')
	in = append(append(in, namespace...), '/')
	sum := sha1.Sum(append(in, name...))
	var u [16]byte
	copy(u[:], sum[:])
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	var buf [36]byte
	hex.Encode(buf[0:8], u[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], u[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], u[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], u[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:], u[10:])
	return types.UID(buf[:])
}

var volumeSourceType = reflect.TypeFor[corev1.VolumeSource]()

func preparePodSpec(spec *corev1.PodSpec) error {
	// Few volumes are compared pairwise, many through a map.
	var seen map[string]bool
	if len(spec.Volumes) > 16 {
		seen = make(map[string]bool, len(spec.Volumes))
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		// Volume names become directory names under the pod directory.
		if msgs := isDNS1123Label(v.Name); len(msgs) > 0 {
			return fmt.Errorf("spec.volumes[%d].name %q: %s", i, v.Name, strings.Join(msgs, "; "))
		}
		dup := seen[v.Name]
		for j := 0; seen == nil && j < i; j++ {
			dup = dup || spec.Volumes[j].Name == v.Name
		}
		if dup {
			return fmt.Errorf("spec.volumes[%d].name %q: duplicate volume name", i, v.Name)
		}
		if seen != nil {
			seen[v.Name] = true
		}
		if n := 1; !oneCommonSource(&v.VolumeSource) {
			if n = countSources(&v.VolumeSource); n != 1 {
				return fmt.Errorf("spec.volumes[%d] (%q): must specify exactly one volume source, found %d", i, v.Name, n)
			}
		}
		defaultVolumeSource(&v.VolumeSource)
	}
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.SecurityContext == nil && spec.TerminationGracePeriodSeconds == nil {
		// Both in one allocation, as most manifests set neither (not
		// shared between pods: a pod's fields are its own).
		d := &podSpecDefaults{gracePeriod: corev1.DefaultTerminationGracePeriodSeconds}
		spec.SecurityContext, spec.TerminationGracePeriodSeconds = &d.securityContext, &d.gracePeriod
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.TerminationGracePeriodSeconds == nil {
		spec.TerminationGracePeriodSeconds = ptr(int64(corev1.DefaultTerminationGracePeriodSeconds))
	}
	return nil
}

type podSpecDefaults struct {
	securityContext corev1.PodSecurityContext
	gracePeriod     int64
}

func countSources(vs *corev1.VolumeSource) int {
	v := reflect.ValueOf(vs).Elem()
	n := 0
	for i := range volumeSourceType.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			n++
		}
	}
	return n
}

// oneCommonSource reports whether vs sets exactly one source and it is one
// that pods use most, by comparing with that source alone: countSources
// walks thirty fields by reflection, a twentieth of parsing a pod. False
// says nothing; TestOneCommonSource holds it to countSources.
func oneCommonSource(vs *corev1.VolumeSource) bool {
	one := corev1.VolumeSource{}
	switch {
	case vs.EmptyDir != nil:
		one.EmptyDir = vs.EmptyDir
	case vs.ConfigMap != nil:
		one.ConfigMap = vs.ConfigMap
	case vs.Secret != nil:
		one.Secret = vs.Secret
	case vs.Projected != nil:
		one.Projected = vs.Projected
	case vs.PersistentVolumeClaim != nil:
		one.PersistentVolumeClaim = vs.PersistentVolumeClaim
	case vs.HostPath != nil:
		one.HostPath = vs.HostPath
	case vs.CSI != nil:
		one.CSI = vs.CSI
	default:
		return false
	}
	return *vs == one
}

// defaultVolumeSource sets what the API server's defaulting sets on the
// volume sources the agent may implement.
func defaultVolumeSource(vs *corev1.VolumeSource) {
	const mode = int32(0o644)
	switch {
	case vs.Secret != nil && vs.Secret.DefaultMode == nil:
		vs.Secret.DefaultMode = ptr(mode)
	case vs.ConfigMap != nil && vs.ConfigMap.DefaultMode == nil:
		vs.ConfigMap.DefaultMode = ptr(mode)
	case vs.DownwardAPI != nil && vs.DownwardAPI.DefaultMode == nil:
		vs.DownwardAPI.DefaultMode = ptr(mode)
	case vs.Projected != nil && vs.Projected.DefaultMode == nil:
		vs.Projected.DefaultMode = ptr(mode)
	case vs.HostPath != nil && vs.HostPath.Type == nil:
		vs.HostPath.Type = ptr(corev1.HostPathUnset)
	case vs.Ephemeral != nil && vs.Ephemeral.VolumeClaimTemplate != nil && vs.Ephemeral.VolumeClaimTemplate.Spec.VolumeMode == nil:
		vs.Ephemeral.VolumeClaimTemplate.Spec.VolumeMode = ptr(corev1.PersistentVolumeFilesystem)
	}
}

func defaultCSIDriver(spec *storagev1.CSIDriverSpec) {
	if spec.AttachRequired == nil {
		spec.AttachRequired = ptr(true)
	}
	if spec.PodInfoOnMount == nil {
		spec.PodInfoOnMount = ptr(false)
	}
	if spec.RequiresRepublish == nil {
		spec.RequiresRepublish = ptr(false)
	}
	if spec.StorageCapacity == nil {
		spec.StorageCapacity = ptr(false)
	}
	if spec.SELinuxMount == nil {
		spec.SELinuxMount = ptr(false)
	}
	if spec.FSGroupPolicy == nil {
		spec.FSGroupPolicy = ptr(storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy)
	}
	if len(spec.VolumeLifecycleModes) == 0 {
		spec.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	}
}

func ptr[T any](v T) *T { return &v }
