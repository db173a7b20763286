package manifest

import (
	"bytes"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "sigs.k8s.io/json"
)

// fastDecode decodes a JSON document of a supported kind in one pass when
// its first two keys are apiVersion and kind, as Kubernetes tools write
// them (and as the YAML conversion, which sorts keys, always does). The
// Kubernetes decoder reads every document twice, once only to find those
// two keys, and parseJSON once more to split documents: a third of the
// cost of parsing a pod.
//
// It succeeds only where the decoder would have succeeded without a
// warning, with the same object; anything else (escapes in those keys,
// another order, an unknown or duplicate field, a syntax error, trailing
// data) is left to the decoder, so messages stay the decoder's.
//
// hint pre-sizes a pod's slices (FuzzParse and TestSliceHint compare the
// outcome with the decoder's, which has no hint).
func (p *parser) fastDecode(js []byte, hint sliceHint) (runtime.Object, schema.GroupVersionKind, bool) {
	if p.decoderOnly {
		return nil, schema.GroupVersionKind{}, false
	}
	apiVersion, kindName, ok := leadingTypeMeta(js)
	if !ok {
		return nil, schema.GroupVersionKind{}, false
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, schema.GroupVersionKind{}, false
	}
	gvk := gv.WithKind(kindName)
	if _, supported := supportedKinds[gvk]; !supported {
		return nil, schema.GroupVersionKind{}, false
	}
	obj, err := scheme.New(gvk)
	if err != nil {
		return nil, schema.GroupVersionKind{}, false
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		hint.presize(pod)
	}
	if jsonv2.Unmarshal(js, obj, strictV2) == nil {
		return obj, gvk, true
	}
	// Refused, or an error: the strict decoder says what it makes of it,
	// into a fresh object (v2 may have filled part of this one).
	if obj, err = scheme.New(gvk); err != nil {
		return nil, schema.GroupVersionKind{}, false
	}
	strictErrs, err := kjson.UnmarshalStrict(js, obj)
	if err != nil || len(strictErrs) > 0 {
		return nil, schema.GroupVersionKind{}, false
	}
	return obj, gvk, true
}

// strictV2 makes go-json-experiment/json, twice as fast as the strict
// decoder with a third of its allocations, fail wherever it would read a
// document otherwise or the strict decoder would warn: an unknown member,
// a member whose name differs from a field's only in case, a duplicate
// name, invalid UTF-8 (which v1 replaces) or a base64 value with line
// breaks (which v1 skips) all are errors. Into a fresh object of the
// supported kinds, whose types TestFastDecodeTypes pins, what it accepts
// it reads as the strict decoder does (FuzzFastDecodeV2 is the oracle);
// all else takes the strict decoder's path.
var strictV2 = jsonv2.JoinOptions(
	jsonv2.RejectUnknownMembers(true),
	jsonv2.MatchCaseInsensitiveNames(false),
	jsontext.AllowDuplicateNames(false),
	jsontext.AllowInvalidUTF8(false),
)

// leadingTypeMeta reads the first two members of the object js holds if
// they are "apiVersion" and "kind" (in either order) with plain string
// values: no escapes, which the decoder would interpret.
func leadingTypeMeta(js []byte) (apiVersion, kind string, ok bool) {
	rest := skipSpace(js)
	if len(rest) == 0 || rest[0] != '{' {
		return "", "", false
	}
	rest = rest[1:]
	for i := range 2 {
		var key, value []byte
		if key, rest, ok = plainString(skipSpace(rest)); !ok {
			return "", "", false
		}
		if rest = skipSpace(rest); len(rest) == 0 || rest[0] != ':' {
			return "", "", false
		}
		if value, rest, ok = plainString(skipSpace(rest[1:])); !ok {
			return "", "", false
		}
		switch string(key) {
		case "apiVersion":
			if apiVersion != "" {
				return "", "", false
			}
			apiVersion = intern(value)
		case "kind":
			if kind != "" {
				return "", "", false
			}
			kind = intern(value)
		default:
			return "", "", false
		}
		if i == 0 {
			if rest = skipSpace(rest); len(rest) == 0 || rest[0] != ',' {
				return "", "", false
			}
			rest = rest[1:]
		}
	}
	return apiVersion, kind, apiVersion != "" && kind != ""
}

// intern returns b as a string, without a copy if it is a supported
// apiVersion or kind.
func intern(b []byte) string {
	for _, s := range internedNames {
		if string(b) == s {
			return s
		}
	}
	return string(b)
}

var internedNames = append([]string{"v1", "storage.k8s.io/v1"}, kindNames[:]...)

// plainString reads a JSON string without escapes at the start of b.
func plainString(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	end := bytes.IndexByte(b[1:], '"')
	if end < 0 {
		return nil, nil, false
	}
	s = b[1 : 1+end]
	for _, c := range s {
		if c == '\\' || c < 0x20 {
			return nil, nil, false
		}
	}
	return s, b[2+end:], true
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	return b
}
